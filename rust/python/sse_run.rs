//! The binding of the SSE run shape: `tokentrail._core.sse_run`.
use pyo3::prelude::*;

use crate::sse_run::run_shape;

/// `(end, events, done)` where `buf[:end]` is a run of complete single-line `data: ` events
/// (no comment, other field or CR) holding `events` of them, none and not what follows them
/// over `max_event` bytes, and `done` where a `[DONE]` event ends it; None where `buf` is not
/// of that shape.
#[pyfunction]
pub(super) fn sse_run(buf: &[u8], max_event: usize) -> Option<(usize, usize, bool)> {
    run_shape(buf, max_event).map(|shape| (shape.end, shape.events, shape.done))
}
