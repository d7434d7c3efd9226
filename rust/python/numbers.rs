//! The binding of the flat number arrays: `tokentrail._core.number_array`.
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PyNone, PyType};

use crate::numbers::{self, Column, Scalar};

/// Values made per hold of the interpreter: a waiting thread (the event loop) gets it back
/// in between, well within the switch interval.
const CHUNK: usize = 16 * 1024;

/// What `number_array` gives back: width, the values flat, the type of each column.
type Numbers<'py> = (usize, Bound<'py, PyList>, Vec<Option<Bound<'py, PyType>>>);

/// `(width, values, types)` of the array whose text between its brackets is `text` (width 0:
/// an array of scalars; else rows of `width` scalars, flat; `types`: the one type of every
/// value of each column, None where they differ), or None when it is anything else. Parsed
/// with the GIL released; the values are made a chunk at a time.
#[pyfunction]
pub(super) fn number_array<'py>(py: Python<'py>, text: &[u8]) -> PyResult<Option<Numbers<'py>>> {
    let Some((flat, kinds)) = py.detach(|| {
        numbers::parse(text).map(|flat| {
            let kinds = numbers::columns(&flat);
            (flat, kinds)
        })
    }) else {
        return Ok(None);
    };
    let list = PyList::empty(py);
    for chunk in flat.values.chunks(CHUNK) {
        for value in chunk {
            match *value {
                Scalar::Int(i) => list.append(i)?,
                Scalar::Float(f) => list.append(f)?,
                Scalar::Bool(b) => list.append(b)?,
                Scalar::Null => list.append(py.None())?,
            }
        }
        py.detach(|| ());
    }
    let types = kinds
        .into_iter()
        .map(|kind| match kind {
            Column::Int => Some(py.get_type::<PyInt>()),
            Column::Float => Some(py.get_type::<PyFloat>()),
            Column::Bool => Some(py.get_type::<PyBool>()),
            Column::Null => Some(py.get_type::<PyNone>()),
            Column::Mixed => None,
        })
        .collect();
    Ok(Some((flat.width, list, types)))
}
