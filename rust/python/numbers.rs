//! The binding of the flat number arrays: `tokentrail._core.number_array`.
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::numbers::{self, Scalar};

/// Values made per hold of the interpreter: a waiting thread (the event loop) gets it back
/// in between, well within the switch interval.
const CHUNK: usize = 16 * 1024;

/// `(width, values)` of the array whose text between its brackets is `text` (width 0: an
/// array of scalars; else rows of `width` scalars, flat), or None when it is anything else.
/// Parsed with the GIL released; the values are made a chunk at a time.
#[pyfunction]
pub(super) fn number_array<'py>(
    py: Python<'py>,
    text: &[u8],
) -> PyResult<Option<(usize, Bound<'py, PyList>)>> {
    let Some(flat) = py.detach(|| numbers::parse(text)) else {
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
    Ok(Some((flat.width, list)))
}
