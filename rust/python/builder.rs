//! The sample-building bindings: `SampleBuilder`, `common_prefix_len` and `linearize`.
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::convert::{counts_dict, held_ids, logprob_vec, token_ids, turn, Logprobs, TurnArg};
use super::detached;
use super::records::{built_sample, linearized, PyBuiltSample, PyDrift, PyLinearized, PySpan};
use crate::builder::SampleBuilder;
use crate::drift::Policy;
use crate::linearize::{self as core, Settings};
use crate::prefix;

/// Accumulates one coherent run of turns into tokens, loss mask and logprobs.
#[pyclass(name = "SampleBuilder", module = "tokentrail._core")]
pub(super) struct PySampleBuilder(SampleBuilder);

#[pymethods]
impl PySampleBuilder {
    #[new]
    #[pyo3(signature = (policy = "minimal", fork_threshold = 1024))]
    fn new(policy: &str, fork_threshold: i64) -> PyResult<Self> {
        let builder = SampleBuilder::new(Policy::parse(policy)?, fork_threshold)?;
        Ok(PySampleBuilder(builder))
    }

    #[getter]
    fn policy(&self) -> &'static str {
        self.0.policy().as_str()
    }

    #[getter]
    fn fork_threshold(&self) -> usize {
        self.0.fork_threshold()
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }

    #[pyo3(signature = (prompt_ids, output_len = 0))]
    fn classify(&self, prompt_ids: &Bound<'_, PyAny>, output_len: usize) -> PyResult<PyDrift> {
        let prompt = token_ids(prompt_ids, "prompt_ids")?;
        Ok(self.0.classify(&prompt, output_len).into())
    }

    /// Append a turn, healing a REALIGN. A FORK is refused: start a new builder.
    #[pyo3(signature = (prompt_ids, output_ids, logprobs = None, *, trained = true, turn = 0))]
    fn append_turn(
        &mut self,
        prompt_ids: &Bound<'_, PyAny>,
        output_ids: &Bound<'_, PyAny>,
        logprobs: Option<Logprobs<'_>>,
        trained: bool,
        turn: i64,
    ) -> PyResult<PyDrift> {
        let prompt = token_ids(prompt_ids, "prompt_ids")?;
        let output = token_ids(output_ids, "output_ids")?;
        let logprobs = logprob_vec(logprobs);
        let drift = self
            .0
            .append_turn(&prompt, &output, logprobs.as_deref(), trained, turn)?;
        Ok(drift.into())
    }

    fn has_trained_response(&self) -> bool {
        self.0.has_trained_response()
    }

    #[getter]
    fn tokens<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        PyArray1::from_slice(py, self.0.tokens())
    }

    #[getter]
    fn loss_mask<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u8>> {
        PyArray1::from_slice(py, self.0.loss_mask())
    }

    #[getter]
    fn logprobs<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f32>> {
        PyArray1::from_slice(py, self.0.logprobs())
    }

    #[getter]
    fn response_start(&self) -> usize {
        self.0.response_start()
    }

    #[getter]
    fn spans(&self) -> Vec<PySpan> {
        self.0.spans().iter().map(PySpan::from).collect()
    }

    #[getter]
    fn realigned<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        counts_dict(py, self.0.realigned())
    }

    /// Cut the sample to `max_sample_tokens` (0: no limit) and return its arrays.
    #[pyo3(signature = (max_sample_tokens = 0))]
    fn finish(&self, py: Python<'_>, max_sample_tokens: i64) -> PyResult<PyBuiltSample> {
        built_sample(py, self.0.finish(max_sample_tokens)?)
    }
}

/// Length of the longest common prefix of two token sequences.
#[pyfunction]
pub(super) fn common_prefix_len(a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<usize> {
    // Read in place: a uint32 array is not copied (a prompt's are compared every turn).
    let (a, b) = (held_ids(a, "a")?, held_ids(b, "b")?);
    Ok(prefix::common_prefix_len(a.as_slice(), b.as_slice()))
}

/// Linearize chains of turns into samples.
///
/// `turns[i]` is `(prompt_ids, output_ids, logprobs or None)`; each chain lists turn indices
/// in order. A turn is trained on the first chain that reaches it and re-emitted as context
/// (mask 0) on later ones. A FORK closes the run and starts a new one.
#[pyfunction]
#[pyo3(signature = (
    turns, chains, *, policy = "minimal", fork_threshold = 1024, max_sample_tokens = 0
))]
pub(super) fn linearize(
    py: Python<'_>,
    turns: Vec<TurnArg<'_>>,
    chains: Vec<Vec<i64>>,
    policy: &str,
    fork_threshold: i64,
    max_sample_tokens: i64,
) -> PyResult<PyLinearized> {
    // Checked in the reference's order: policy, settings, each turn in turn, then the chains.
    let settings = Settings::new(Policy::parse(policy)?, fork_threshold, max_sample_tokens)?;
    let turns = turns.into_iter().map(turn).collect::<PyResult<Vec<_>>>()?;
    let out = detached(py, move || core::linearize(&turns, &chains, settings))?;
    linearized(py, out)
}
