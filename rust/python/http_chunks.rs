//! The binding of a chunked body's framing taken off: `tokentrail._core.http_chunks`.
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::http_chunks::unchunk;

/// `(body, end, left, last)` of the read `buf`, `left` bytes into the current chunk (its data
/// and CRLF; 0 at a size line): the chunks' data joined, the bytes taken (the rest starts a
/// size line or the trailers, for the next read), the bytes of the current chunk still to
/// come, and whether the last chunk ended the body. Raises `ChunkedBodyError` for broken
/// framing.
#[pyfunction]
pub(super) fn http_chunks<'py>(
    py: Python<'py>,
    buf: &[u8],
    left: usize,
) -> PyResult<(Bound<'py, PyBytes>, usize, usize, bool)> {
    let got = unchunk(buf, left)?;
    Ok((PyBytes::new(py, &got.body), got.end, got.left, got.last))
}
