//! The binding of the incremental tokenizer: `tokentrail._core.IncrementalTokenizer`.
//!
//! The tokenizer sits behind a mutex, taken with the GIL released, so that threads sharing one
//! instance wait for each other instead of failing to borrow it.
use std::sync::{Mutex, MutexGuard, PoisonError};

use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;

use super::detached;
use crate::tokenize::IncrementalTokenizer;

/// Encodes each session's prompt from the last added token it shares with the previous one.
#[pyclass(name = "IncrementalTokenizer", module = "tokentrail._core", frozen)]
pub(super) struct PyIncrementalTokenizer {
    inner: Mutex<IncrementalTokenizer>,
    /// Settled at load time; read without the lock.
    fallback_reason: Option<String>,
    fast_path_reason: Option<String>,
}

impl PyIncrementalTokenizer {
    fn lock(&self) -> MutexGuard<'_, IncrementalTokenizer> {
        // A panic inside the tokenizer leaves at worst a session forgotten: go on.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[pymethods]
impl PyIncrementalTokenizer {
    /// `fast_path=False` encodes through `tokenizers` even where the fast encoder fits.
    #[new]
    #[pyo3(signature = (tokenizer_json, *, fast_path = true))]
    fn new(py: Python<'_>, tokenizer_json: &str, fast_path: bool) -> PyResult<Self> {
        let mut tokenizer = detached(py, || IncrementalTokenizer::from_json(tokenizer_json))?;
        if !fast_path {
            tokenizer = tokenizer.without_fast_path();
        }
        Ok(PyIncrementalTokenizer {
            fallback_reason: tokenizer.fallback_reason().map(str::to_owned),
            fast_path_reason: tokenizer.fast_path_reason().map(str::to_owned),
            inner: Mutex::new(tokenizer),
        })
    }

    /// A tokenizer sharing this one's loaded vocabulary, with no session kept.
    fn fork(&self, py: Python<'_>) -> Self {
        let forked = py.detach(|| self.lock().fork());
        PyIncrementalTokenizer {
            inner: Mutex::new(forked),
            fallback_reason: self.fallback_reason.clone(),
            fast_path_reason: self.fast_path_reason.clone(),
        }
    }

    /// The ids of `text`, reusing `session`'s previous prompt up to the last safe boundary.
    fn encode<'py>(
        &self,
        py: Python<'py>,
        session: &str,
        text: &str,
    ) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let ids = detached(py, || self.lock().encode(session, text))?;
        Ok(ids.into_pyarray(py))
    }

    /// The ids of `text`, encoded in full.
    fn encode_full<'py>(&self, py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let ids = detached(py, || self.lock().encode_full(text))?;
        Ok(ids.into_pyarray(py))
    }

    /// Drop what is kept for `session`.
    fn forget(&self, py: Python<'_>, session: &str) {
        py.detach(|| self.lock().forget(session));
    }

    /// How many sessions have a prompt kept.
    fn sessions(&self, py: Python<'_>) -> usize {
        py.detach(|| self.lock().sessions())
    }

    /// Whether prompts are resumed after added tokens; when not, every encode is a full one.
    #[getter]
    fn safe(&self) -> bool {
        self.fallback_reason.is_none()
    }

    /// Why boundaries after added tokens are not safe for this tokenizer, when they are not.
    #[getter]
    fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    /// Whether text is encoded by the core's fast encoder rather than by `tokenizers`.
    #[getter]
    fn fast_path(&self) -> bool {
        self.fast_path_reason.is_none()
    }

    /// Why text is encoded by `tokenizers`, when it is.
    #[getter]
    fn fast_path_reason(&self) -> Option<&str> {
        self.fast_path_reason.as_deref()
    }

    /// Ids taken from kept prompts instead of being encoded, over all `encode` calls.
    fn reused_ids(&self, py: Python<'_>) -> u64 {
        py.detach(|| self.lock().reused_ids())
    }

    /// Bytes of text actually run through the tokenizer, over all `encode` calls.
    fn encoded_bytes(&self, py: Python<'_>) -> u64 {
        py.detach(|| self.lock().encoded_bytes())
    }
}
