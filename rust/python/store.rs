//! The binding of the compact turn store: `tokentrail._core.TurnStore`.
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;

use super::convert::{held_ids, Held, Logprobs};
use super::detached;
use super::records::{linearized, PyLinearized};
use crate::drift::Policy;
use crate::linearize::Settings;
use crate::store::TurnStore;

/// Every turn of one session, stored compactly: a prompt is the prefix it shares with its
/// parent turn's tokens (prompt + output) plus its own tail.
#[pyclass(name = "TurnStore", module = "tokentrail._core")]
pub(super) struct PyTurnStore(TurnStore);

#[pymethods]
impl PyTurnStore {
    #[new]
    fn new() -> Self {
        PyTurnStore(TurnStore::new())
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }

    /// Store a turn; `parent` is the turn whose tokens its prompt continues, or -1.
    #[pyo3(signature = (parent, prompt_ids, output_ids, logprobs = None))]
    fn push(
        &mut self,
        parent: i64,
        prompt_ids: &Bound<'_, PyAny>,
        output_ids: &Bound<'_, PyAny>,
        logprobs: Option<Logprobs<'_>>,
    ) -> PyResult<usize> {
        let prompt = held_ids(prompt_ids, "prompt_ids")?;
        let output = held_ids(output_ids, "output_ids")?;
        let logprobs = logprobs.as_ref().map(Held::like);
        let logprobs = logprobs.as_ref().map(Held::as_slice);
        Ok(self
            .0
            .push(parent, prompt.as_slice(), output.as_slice(), logprobs)?)
    }

    fn prompt_ids<'py>(&self, py: Python<'py>, turn: i64) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let turn = self.0.index(turn)?;
        Ok(self.0.prompt(turn).into_pyarray(py))
    }

    /// The turn's prompt then output ids.
    fn tokens<'py>(&self, py: Python<'py>, turn: i64) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let turn = self.0.index(turn)?;
        Ok(self.0.tokens(turn).into_pyarray(py))
    }

    fn output_ids<'py>(&self, py: Python<'py>, turn: i64) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let turn = self.0.index(turn)?;
        Ok(PyArray1::from_slice(py, self.0.output(turn)))
    }

    fn logprobs<'py>(
        &self,
        py: Python<'py>,
        turn: i64,
    ) -> PyResult<Option<Bound<'py, PyArray1<f32>>>> {
        let turn = self.0.index(turn)?;
        let logprobs = self.0.logprobs(turn);
        Ok(logprobs.map(|logprobs| PyArray1::from_slice(py, logprobs)))
    }

    fn output_len(&self, turn: i64) -> PyResult<usize> {
        let turn = self.0.index(turn)?;
        Ok(self.0.output(turn).len())
    }

    /// Bytes the stored ids and logprobs take: 4 per id, 4 per logprob, 8 per turn.
    fn nbytes(&self) -> usize {
        self.0.nbytes()
    }

    /// Bytes held: what the store's buffers have allocated.
    fn heap_bytes(&self) -> usize {
        self.0.heap_bytes()
    }

    /// `linearize` over the stored turns: chains name turn ids.
    #[pyo3(signature = (chains, *, policy = "minimal", fork_threshold = 1024, max_sample_tokens = 0))]
    fn linearize(
        &self,
        py: Python<'_>,
        chains: Vec<Vec<i64>>,
        policy: &str,
        fork_threshold: i64,
        max_sample_tokens: i64,
    ) -> PyResult<PyLinearized> {
        // Checked in the reference's order: policy, settings, then the chains.
        let settings = Settings::new(Policy::parse(policy)?, fork_threshold, max_sample_tokens)?;
        let store = &self.0;
        let out = detached(py, move || store.linearize(&chains, settings))?;
        linearized(py, out)
    }
}
