//! The small read-only result classes (`Drift`, `Span`, `BuiltSample`, `DriftEvent`,
//! `Linearized`, `Packed`) and their conversion from the core's results; arrays are handed
//! over without a copy.
use numpy::{IntoPyArray, PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::convert::counts_dict;
use crate::builder::{BuiltSample, Span};
use crate::drift::{Drift, DriftKind};
use crate::linearize::{DriftEvent, Linearized};
use crate::pack::Packed;

/// How an incoming prompt relates to the tokens a builder holds.
#[pyclass(name = "Drift", module = "tokentrail._core", frozen, eq, hash, get_all)]
#[derive(PartialEq, Eq, Hash)]
pub(super) struct PyDrift {
    kind: &'static str,
    at: usize,
    drifted: usize,
}

#[pymethods]
impl PyDrift {
    #[new]
    fn new(kind: &str, at: usize, drifted: usize) -> PyResult<Self> {
        let kind = drift_kind(kind)?;
        Ok(PyDrift { kind, at, drifted })
    }

    fn __repr__(&self) -> String {
        let PyDrift { kind, at, drifted } = self;
        format!("Drift(kind='{kind}', at={at}, drifted={drifted})")
    }
}

impl From<Drift> for PyDrift {
    fn from(Drift { kind, at, drifted }: Drift) -> Self {
        let kind = kind.as_str();
        PyDrift { kind, at, drifted }
    }
}

/// The drift kind named `name`, as the name the records hold.
fn drift_kind(name: &str) -> PyResult<&'static str> {
    let kind = DriftKind::parse(name).ok_or_else(|| {
        let expected = "expected 'clean', 'realign' or 'fork'";
        PyValueError::new_err(format!("unknown drift kind {name:?}; {expected}"))
    })?;
    Ok(kind.as_str())
}

/// One turn's sampled output inside a builder: tokens [start, end).
#[pyclass(name = "Span", module = "tokentrail._core", frozen, eq, get_all)]
#[derive(PartialEq)]
pub(super) struct PySpan {
    turn: i64,
    start: usize,
    end: usize,
}

#[pymethods]
impl PySpan {
    #[new]
    fn new(turn: i64, start: usize, end: usize) -> Self {
        PySpan { turn, start, end }
    }

    fn __repr__(&self) -> String {
        let PySpan { turn, start, end } = self;
        format!("Span(turn={turn}, start={start}, end={end})")
    }
}

impl From<&Span> for PySpan {
    fn from(&Span { turn, start, end }: &Span) -> Self {
        PySpan { turn, start, end }
    }
}

/// A drift decision taken while adding a turn to a run of a chain.
#[pyclass(
    name = "DriftEvent",
    module = "tokentrail._core",
    frozen,
    eq,
    hash,
    get_all
)]
#[derive(PartialEq, Eq, Hash)]
pub(super) struct PyDriftEvent {
    chain: usize,
    turn: usize,
    kind: &'static str,
    at: usize,
    drifted: usize,
}

#[pymethods]
impl PyDriftEvent {
    #[new]
    fn new(chain: usize, turn: usize, kind: &str, at: usize, drifted: usize) -> PyResult<Self> {
        let kind = drift_kind(kind)?;
        Ok(PyDriftEvent {
            chain,
            turn,
            kind,
            at,
            drifted,
        })
    }

    fn __repr__(&self) -> String {
        let PyDriftEvent {
            chain,
            turn,
            kind,
            at,
            drifted,
        } = self;
        format!("DriftEvent(chain={chain}, turn={turn}, kind='{kind}', at={at}, drifted={drifted})")
    }
}

impl From<DriftEvent> for PyDriftEvent {
    fn from(event: DriftEvent) -> Self {
        PyDriftEvent {
            chain: event.chain,
            turn: event.turn,
            kind: event.kind.as_str(),
            at: event.at,
            drifted: event.drifted,
        }
    }
}

/// One linearized run: `tokens` in full, `loss_mask`/`logprobs` over the response part.
#[pyclass(name = "BuiltSample", module = "tokentrail._core", get_all)]
pub(super) struct PyBuiltSample {
    tokens: Py<PyArray1<u32>>,
    loss_mask: Py<PyArray1<u8>>,
    logprobs: Py<PyArray1<f32>>,
    response_start: usize,
    truncated: bool,
    turns: Py<PyList>,
    spans: Py<PyList>,
    trained: Py<PyDict>,
    realigned: Py<PyDict>,
    truncated_tokens: Py<PyDict>,
    #[pyo3(set)]
    chain: usize,
}

#[pymethods]
impl PyBuiltSample {
    /// Whether any token of `loss_mask` is trained.
    fn has_trained_response(&self, py: Python<'_>) -> bool {
        let mask = self.loss_mask.bind(py).readonly();
        mask.as_array().iter().any(|&bit| bit != 0)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "BuiltSample(chain={}, tokens={}, response_start={}, truncated={}, turns={})",
            self.chain,
            self.tokens.bind(py).len(),
            self.response_start,
            if self.truncated { "True" } else { "False" },
            self.turns.bind(py).repr()?,
        ))
    }
}

/// The sample's vectors handed to numpy as they are, its ledgers as dicts.
pub(super) fn built_sample(py: Python<'_>, sample: BuiltSample) -> PyResult<PyBuiltSample> {
    Ok(PyBuiltSample {
        tokens: sample.tokens.into_pyarray(py).unbind(),
        loss_mask: sample.loss_mask.into_pyarray(py).unbind(),
        logprobs: sample.logprobs.into_pyarray(py).unbind(),
        response_start: sample.response_start,
        truncated: sample.truncated,
        turns: PyList::new(py, sample.turns)?.unbind(),
        spans: PyList::new(py, sample.spans.iter().map(PySpan::from))?.unbind(),
        trained: counts_dict(py, &sample.trained)?.unbind(),
        realigned: counts_dict(py, &sample.realigned)?.unbind(),
        truncated_tokens: counts_dict(py, &sample.truncated_tokens)?.unbind(),
        chain: sample.chain,
    })
}

/// Every sample of a set of chains, with the drift decisions taken on the way.
#[pyclass(name = "Linearized", module = "tokentrail._core", frozen, get_all)]
pub(super) struct PyLinearized {
    samples: Py<PyList>,
    drifts: Py<PyList>,
    trained: Py<PyDict>,
    realigned: Py<PyDict>,
    truncated: Py<PyDict>,
}

#[pymethods]
impl PyLinearized {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Linearized(samples={}, drifts={})",
            self.samples.bind(py).len(),
            self.drifts.bind(py).len()
        )
    }
}

/// The samples and drift events as records, the ledgers as dicts.
pub(super) fn linearized(py: Python<'_>, out: Linearized) -> PyResult<PyLinearized> {
    let samples = out
        .samples
        .into_iter()
        .map(|sample| Py::new(py, built_sample(py, sample)?))
        .collect::<PyResult<Vec<_>>>()?;
    let drifts = out.drifts.into_iter().map(PyDriftEvent::from);
    Ok(PyLinearized {
        samples: PyList::new(py, samples)?.unbind(),
        drifts: PyList::new(py, drifts)?.unbind(),
        trained: counts_dict(py, &out.trained)?.unbind(),
        realigned: counts_dict(py, &out.realigned)?.unbind(),
        truncated: counts_dict(py, &out.truncated)?.unbind(),
    })
}

/// Samples flattened into one varlen-attention batch: see
/// `tokentrail.storage.export.PackedBatch`.
#[pyclass(name = "Packed", module = "tokentrail._core", frozen, get_all)]
pub(super) struct PyPacked {
    tokens: Py<PyArray1<u32>>,
    cu_seqlens: Py<PyArray1<i32>>,
    position_ids: Py<PyArray1<i32>>,
    sample_index: Py<PyArray1<i32>>,
    loss_mask: Py<PyArray1<u8>>,
    logprobs: Py<PyArray1<f32>>,
    rewards: Py<PyArray1<f32>>,
    advantages: Py<PyArray1<f32>>,
    max_seqlen: usize,
    routed_experts: Option<Py<PyAny>>,
    indexer_topk: Option<Py<PyAny>>,
}

#[pymethods]
impl PyPacked {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Packed(samples={}, tokens={}, max_seqlen={})",
            self.rewards.bind(py).len(),
            self.tokens.bind(py).len(),
            self.max_seqlen
        )
    }
}

/// The packed vectors handed to numpy as they are, without a copy, with the packed replay rows.
pub(super) fn packed(
    py: Python<'_>,
    out: Packed,
    [routed_experts, indexer_topk]: [Option<Bound<'_, PyAny>>; 2],
) -> PyPacked {
    PyPacked {
        routed_experts: routed_experts.map(Bound::unbind),
        indexer_topk: indexer_topk.map(Bound::unbind),
        tokens: out.tokens.into_pyarray(py).unbind(),
        cu_seqlens: out.cu_seqlens.into_pyarray(py).unbind(),
        position_ids: out.position_ids.into_pyarray(py).unbind(),
        sample_index: out.sample_index.into_pyarray(py).unbind(),
        loss_mask: out.loss_mask.into_pyarray(py).unbind(),
        logprobs: out.logprobs.into_pyarray(py).unbind(),
        rewards: out.rewards.into_pyarray(py).unbind(),
        advantages: out.advantages.into_pyarray(py).unbind(),
        max_seqlen: out.max_seqlen,
    }
}
