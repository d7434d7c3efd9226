//! The binding of the body index: `tokentrail._core.index_body`, `diff_bodies`, `BodyIndex`.
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;

use super::BodyShapeError;
use crate::body::{self, BodyIndex};

/// Where a request body's top-level fields and its array field's elements lie.
#[pyclass(name = "BodyIndex", module = "tokentrail._core", frozen)]
pub(super) struct PyBodyIndex(BodyIndex);

#[pymethods]
impl PyBodyIndex {
    /// `(key, start, end)` of each top-level field, in body order.
    #[getter]
    fn fields(&self) -> Vec<(String, usize, usize)> {
        self.0
            .fields
            .iter()
            .map(|(key, span)| (key.clone(), span.start, span.end))
            .collect()
    }

    /// The position in `fields` of the array field; None when the body has no such array.
    #[getter]
    fn array_field(&self) -> Option<usize> {
        self.0.array_field
    }

    /// `(start, end)` of each element of the array field.
    #[getter]
    fn elements(&self) -> Vec<(usize, usize)> {
        self.0.elements.iter().map(|s| (s.start, s.end)).collect()
    }

    /// `(start, end)` of each element of the array field from the `start`-th on (what a
    /// caller that reuses the earlier ones reads: no tuple made for those).
    fn elements_from(&self, start: usize) -> Vec<(usize, usize)> {
        let from = start.min(self.0.elements.len());
        self.0.elements[from..]
            .iter()
            .map(|s| (s.start, s.end))
            .collect()
    }

    #[getter]
    fn depth(&self) -> usize {
        self.0.depth
    }

    #[getter]
    fn structural(&self) -> usize {
        self.0.structural
    }

    #[getter]
    fn surrogate_escape(&self) -> bool {
        self.0.surrogate_escape
    }

    fn __len__(&self) -> usize {
        self.0.elements.len()
    }
}

/// Index `body`; `array` names the field whose elements get spans. `previous`: the
/// session's previous body and its index, taken for the bytes both share (the same result
/// as without it). `BodyShapeError` when the index does not take the body.
#[pyfunction]
#[pyo3(signature = (body, array, previous = None))]
pub(super) fn index_body(
    py: Python<'_>,
    body: &[u8],
    array: &str,
    previous: Option<(PyBackedBytes, Bound<'_, PyBodyIndex>)>,
) -> PyResult<PyBodyIndex> {
    let result = match &previous {
        Some((old_body, old)) => {
            let (old_body, old): (&[u8], &BodyIndex) = (old_body, &old.get().0);
            py.detach(|| body::index_after(old_body, old, body, array))
        }
        None => py.detach(|| body::index(body, array)),
    };
    result
        .map(PyBodyIndex)
        .map_err(|err| BodyShapeError::new_err(err.to_string()))
}

/// `(changed_fields, first_changed)`: the positions in `new.fields` whose values differ from
/// `old`'s, and the first element of the array that differs.
#[pyfunction]
pub(super) fn diff_bodies(
    py: Python<'_>,
    old_body: &[u8],
    old: &PyBodyIndex,
    new_body: &[u8],
    new: &PyBodyIndex,
) -> (Vec<usize>, usize) {
    let d = py.detach(|| body::diff(old_body, &old.0, new_body, &new.0));
    (d.changed_fields, d.first_changed)
}
