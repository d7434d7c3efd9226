//! The binding of the compact turn store: `tokentrail._core.TurnStore`.
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;

use super::convert::{held_ids, Held, Logprobs};
use super::detached;
use super::records::{linearized, PyLinearized};
use super::rows::{column_array, given};
use crate::drift::Policy;
use crate::linearize::Settings;
use crate::store::TurnStore;
use crate::tape::{Channel, Shape};

/// Every turn of one session, stored compactly: a prompt is the prefix it shares with its
/// parent turn's tokens (prompt + output) plus its own tail.
#[pyclass(name = "TurnStore", module = "tokentrail._core")]
pub(super) struct PyTurnStore(TurnStore);

#[pymethods]
impl PyTurnStore {
    /// `routed_experts=(layers, top_k, num_experts)` and `indexer_topk=(layers, top_k)` make
    /// the store keep those replay tapes.
    #[new]
    #[pyo3(signature = (*, routed_experts = None, indexer_topk = None))]
    fn new(
        routed_experts: Option<(i64, i64, i64)>,
        indexer_topk: Option<(i64, i64)>,
    ) -> PyResult<Self> {
        let routed = routed_experts
            .map(|(layers, top_k, experts)| Shape::routing(layers, top_k, experts))
            .transpose()?;
        let indexer = indexer_topk
            .map(|(layers, top_k)| Shape::indexer(layers, top_k))
            .transpose()?;
        Ok(PyTurnStore(TurnStore::with_tapes(routed, indexer)))
    }

    /// `(layers, top_k, num_experts)` of the routed-experts tape, or None.
    #[getter]
    fn routed_experts_shape(&self) -> Option<(usize, usize, i64)> {
        let shape = self.0.tape(Channel::RoutedExperts)?.shape();
        Some((shape.layers, shape.width, shape.max + 1))
    }

    /// `(layers, top_k)` of the indexer top-k tape, or None.
    #[getter]
    fn indexer_topk_shape(&self) -> Option<(usize, usize)> {
        let shape = self.0.tape(Channel::IndexerTopk)?.shape();
        Some((shape.layers, shape.width))
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }

    /// Store a turn; `parent` is the turn whose tokens its prompt continues, or -1. Each replay
    /// argument is None, a reason it has no rows, or `(start, rows)`.
    #[pyo3(signature = (
        parent, prompt_ids, output_ids, logprobs = None, *, routed_experts = None,
        indexer_topk = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        parent: i64,
        prompt_ids: &Bound<'_, PyAny>,
        output_ids: &Bound<'_, PyAny>,
        logprobs: Option<Logprobs<'_>>,
        routed_experts: Option<Bound<'_, PyAny>>,
        indexer_topk: Option<Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let prompt = held_ids(prompt_ids, "prompt_ids")?;
        let output = held_ids(output_ids, "output_ids")?;
        let (prompt, output) = (prompt.as_slice(), output.as_slice());
        let routed = given(routed_experts.as_ref(), "routed_experts", prompt.len())?;
        let indexer = given(indexer_topk.as_ref(), "indexer_topk", prompt.len())?;
        let logprobs = logprobs.as_ref().map(Held::like);
        let logprobs = logprobs.as_ref().map(Held::as_slice);
        let replay = [routed.input(), indexer.input()];
        Ok(self
            .0
            .push_replay(parent, prompt, output, logprobs, replay)?)
    }

    /// The first position whose replay rows a turn with this prompt pushed under `parent`
    /// would take from its own request: the start to ask the engine for.
    fn replay_start(&mut self, parent: i64, prompt_ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        let prompt = held_ids(prompt_ids, "prompt_ids")?;
        Ok(self.0.replay_start(parent, prompt.as_slice())?)
    }

    /// The turn's first `length` positions (default: all) of routed experts: rows
    /// `[length, layers, top_k]` and one `REPLAY_STATUS` code per position.
    #[pyo3(signature = (turn, length = None))]
    fn routed_experts<'py>(
        &self,
        py: Python<'py>,
        turn: i64,
        length: Option<usize>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyArray1<u8>>)> {
        self.replay_rows(py, Channel::RoutedExperts, turn, length)
    }

    /// `routed_experts` for the indexer top-k tape.
    #[pyo3(signature = (turn, length = None))]
    fn indexer_topk<'py>(
        &self,
        py: Python<'py>,
        turn: i64,
        length: Option<usize>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyArray1<u8>>)> {
        self.replay_rows(py, Channel::IndexerTopk, turn, length)
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

    /// Bytes the stored ids and logprobs take: 4 per id, 4 per logprob, 8 per turn, and each
    /// replay tape's values at their element size.
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

impl PyTurnStore {
    fn replay_rows<'py>(
        &self,
        py: Python<'py>,
        channel: Channel,
        turn: i64,
        length: Option<usize>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyArray1<u8>>)> {
        let turn = self.0.index(turn)?;
        let length = length.unwrap_or_else(|| self.0.token_count(turn));
        let (rows, status) = self.0.replay_rows(channel, turn, length)?;
        let shape = self
            .0
            .tape(channel)
            .expect("replay_rows refuses a store without the tape")
            .shape();
        let rows = column_array(py, rows, [length, shape.layers, shape.width])?;
        Ok((rows, status.into_pyarray(py)))
    }
}
