//! The binding of an SGLang stream run read at once: `tokentrail._core.sglang_run`.
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::sglang_run::take;

/// Tokens made per hold of the interpreter: a waiting thread (the event loop) gets it back
/// in between, well within the switch interval.
const CHUNK: usize = 16 * 1024;

/// What `sglang_run` gives back: the ids and the logprobs.
type Run<'py> = (Bound<'py, PyList>, Bound<'py, PyList>);

/// The tokens of the run of SGLang stream events whose bytes are `body` (`data: ` + the events
/// joined by `\n\ndata: ` + `\n\n`), after `have` tokens taken: `(ids, logprobs)`, or None
/// where an event is not of the plain shape or the counts do not add up. Parsed with the GIL
/// released; the lists are made a chunk at a time.
#[pyfunction]
pub(super) fn sglang_run<'py>(
    py: Python<'py>,
    body: &[u8],
    have: usize,
) -> PyResult<Option<Run<'py>>> {
    let Some(taken) = py.detach(|| take(body, have)) else {
        return Ok(None);
    };
    let (ids, logprobs) = (PyList::empty(py), PyList::empty(py));
    for (n, (logprob, id)) in taken.logprobs.into_iter().zip(taken.ids).enumerate() {
        if n > 0 && n % CHUNK == 0 {
            py.detach(|| ());
        }
        logprobs.append(logprob)?;
        ids.append(id)?;
    }
    Ok(Some((ids, logprobs)))
}
