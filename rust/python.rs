//! The Python binding `tokentrail._core`: convert the arguments, call the core, convert back.
//!
//! The core refuses bad settings, logprobs and chains before it does any work; the binding
//! reads token ids out of Python, refusing what is not an id with the reference's message.
use std::fmt::Display;

use numpy::{
    AllowTypeChange, Element, IntoPyArray, PyArray1, PyArrayDescrMethods, PyArrayLike1,
    PyArrayMethods, PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::marker::Ungil;
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyBool, PyDict, PyList, PyTuple};

use crate::builder::{BuiltSample, SampleBuilder, Span};
use crate::counts::Counts;
use crate::drift::{Drift, DriftKind, Policy};
use crate::error::Error;
use crate::linearize::{self as core, Linearized, Settings, Turn};
use crate::pack::{self, Packed};
use crate::prefix;

pyo3::import_exception!(tokentrail.errors, TokenIdError);
pyo3::import_exception!(tokentrail.errors, LogprobLengthError);
pyo3::import_exception!(tokentrail.errors, PolicyError);
pyo3::import_exception!(tokentrail.errors, PackError);
pyo3::import_exception!(tokentrail.tokenizer, TokenizerError);

impl From<Error> for PyErr {
    fn from(err: Error) -> PyErr {
        let message = err.to_string();
        match err {
            Error::TokenId(_) => TokenIdError::new_err(message),
            Error::LogprobLength { .. } => LogprobLengthError::new_err(message),
            Error::UnknownPolicy(_)
            | Error::Negative { .. }
            | Error::Fork { .. }
            | Error::TurnOutOfRange { .. }
            | Error::NoSuchTurn { .. } => PolicyError::new_err(message),
            Error::PackCount { .. }
            | Error::ResponseLength { .. }
            | Error::PackLength { .. }
            | Error::PackTooLong { .. } => PackError::new_err(message),
            Error::Tokenizer(_) => TokenizerError::new_err(message),
        }
    }
}

/// Register the module's contents; `lib.rs` declares the module itself.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CLEAN", DriftKind::Clean.as_str())?;
    m.add("REALIGN", DriftKind::Realign.as_str())?;
    m.add("FORK", DriftKind::Fork.as_str())?;
    m.add("POLICIES", PyTuple::new(m.py(), Policy::NAMES)?)?;
    m.add_class::<PyDrift>()?;
    m.add_class::<PySpan>()?;
    m.add_class::<PySampleBuilder>()?;
    m.add_class::<PyBuiltSample>()?;
    m.add_class::<PyDriftEvent>()?;
    m.add_class::<PyLinearized>()?;
    m.add_class::<PyPacked>()?;
    m.add_function(wrap_pyfunction!(common_prefix_len, m)?)?;
    m.add_function(wrap_pyfunction!(linearize, m)?)?;
    m.add_function(wrap_pyfunction!(pack_samples, m)?)?;
    Ok(())
}

/// Run `work` with the GIL released; its error becomes the matching Python exception.
pub(crate) fn detached<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    F: Ungil + FnOnce() -> Result<T, Error>,
    Result<T, Error>: Ungil,
{
    py.detach(work).map_err(PyErr::from)
}

// --- Arguments -----------------------------------------------------------------------------------

/// Token ids from a 1-D integer numpy array or a list or tuple of ints (numpy ints too, bools
/// not), each in `[0, 2**32)`. `what` names the argument in the `TokenIdError`.
fn token_ids(ids: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    if let Ok(array) = ids.cast::<PyArray1<u32>>() {
        return Ok(array.readonly().as_array().to_vec());
    }
    if let Ok(array) = ids.cast::<PyUntypedArray>() {
        return array_ids(array, what);
    }
    if !(ids.is_instance_of::<PyList>() || ids.is_instance_of::<PyTuple>()) {
        let got = ids.get_type().name()?;
        return Err(token_error(
            what,
            format!("expected a list of ints, got {got}"),
        ));
    }
    let py = ids.py();
    ids.try_iter()?
        .enumerate()
        .map(|(pos, id)| {
            let id = id?;
            let problem = match id.extract::<u32>() {
                Ok(n) if !id.is_instance_of::<PyBool>() => return Ok(n),
                Err(err) if err.is_instance_of::<PyOverflowError>(py) => {
                    format!("id {id} is outside [0, 2**32)")
                }
                _ => format!("expected an int, got {}", id.get_type().name()?),
            };
            Err(token_error(format!("{what}[{pos}]"), problem))
        })
        .collect()
}

/// Ids from an integer array of another dtype or byte order: range-checked, then converted
/// by numpy.
fn array_ids(array: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<Vec<u32>> {
    let dtype = array.dtype();
    if array.ndim() != 1 || !matches!(dtype.kind(), b'i' | b'u') {
        let shape = array.getattr("shape")?;
        let problem = format!("expected a 1-D integer array, got {dtype}{shape}");
        return Err(token_error(what, problem));
    }
    let fits = |end: &str| -> PyResult<bool> {
        let id: i128 = array.call_method0(end)?.extract()?;
        Ok(u32::try_from(id).is_ok())
    };
    if !(array.is_empty() || fits("min")? && fits("max")?) {
        return Err(token_error(what, "ids must lie in [0, 2**32)"));
    }
    let ids = array.call_method1("astype", ("uint32",))?;
    Ok(ids.cast::<PyArray1<u32>>()?.readonly().as_array().to_vec())
}

/// A `TokenIdError` about the argument `what`, or one of its items.
fn token_error(what: impl Display, problem: impl Display) -> PyErr {
    Error::TokenId(format!("{what}: {problem}")).into()
}

/// Logprobs as numpy reads them: a float32 array in place, other floats converted.
pub(crate) type Logprobs<'py> = PyArrayLike1<'py, f32, AllowTypeChange>;

fn logprob_vec(logprobs: Option<Logprobs<'_>>) -> Option<Vec<f32>> {
    logprobs.map(|logprobs| logprobs.as_array().to_vec())
}

/// A 1-D array's elements: read in place from a contiguous numpy array, copied otherwise.
pub(crate) enum Held<'py, T: Element> {
    InPlace(PyReadonlyArray1<'py, T>),
    Copied(Vec<T>),
}

impl<'py, T: Element + Clone> Held<'py, T> {
    fn new(array: PyReadonlyArray1<'py, T>) -> Self {
        if array.is_contiguous() {
            Held::InPlace(array)
        } else {
            Held::Copied(array.as_array().to_vec())
        }
    }

    /// What numpy's `asarray(values, dtype)` reads, in place when it is already that array.
    pub(crate) fn like(values: &PyArrayLike1<'py, T, AllowTypeChange>) -> Self {
        Held::new((**values).clone())
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        match self {
            Held::InPlace(array) => array.as_slice().expect("held arrays are contiguous"),
            Held::Copied(values) => values,
        }
    }
}

/// Token ids: a uint32 array in place, anything else through `token_ids`.
pub(crate) fn held_ids<'py>(ids: &Bound<'py, PyAny>, what: &str) -> PyResult<Held<'py, u32>> {
    match ids.cast::<PyArray1<u32>>() {
        Ok(array) => Ok(Held::new(array.readonly())),
        Err(_) => token_ids(ids, what).map(Held::Copied),
    }
}

// --- Records -------------------------------------------------------------------------------------

/// How an incoming prompt relates to the tokens a builder holds.
#[pyclass(name = "Drift", module = "tokentrail._core", frozen, eq, hash, get_all)]
#[derive(PartialEq, Eq, Hash)]
struct PyDrift {
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
struct PySpan {
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
struct PyDriftEvent {
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

/// One linearized run: `tokens` in full, `loss_mask`/`logprobs` over the response part.
#[pyclass(name = "BuiltSample", module = "tokentrail._core", get_all)]
struct PyBuiltSample {
    tokens: Py<PyArray1<u32>>,
    loss_mask: Py<PyArray1<u8>>,
    logprobs: Py<PyArray1<f32>>,
    response_start: usize,
    truncated: bool,
    turns: Py<PyList>,
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

fn built_sample(py: Python<'_>, sample: BuiltSample) -> PyResult<PyBuiltSample> {
    Ok(PyBuiltSample {
        tokens: sample.tokens.into_pyarray(py).unbind(),
        loss_mask: sample.loss_mask.into_pyarray(py).unbind(),
        logprobs: sample.logprobs.into_pyarray(py).unbind(),
        response_start: sample.response_start,
        truncated: sample.truncated,
        turns: PyList::new(py, sample.turns)?.unbind(),
        trained: counts_dict(py, &sample.trained)?.unbind(),
        realigned: counts_dict(py, &sample.realigned)?.unbind(),
        truncated_tokens: counts_dict(py, &sample.truncated_tokens)?.unbind(),
        chain: sample.chain,
    })
}

fn counts_dict<'py>(py: Python<'py>, counts: &Counts) -> PyResult<Bound<'py, PyDict>> {
    counts.iter().into_py_dict(py)
}

/// Every sample of a set of chains, with the drift decisions taken on the way.
#[pyclass(name = "Linearized", module = "tokentrail._core", frozen, get_all)]
pub(crate) struct PyLinearized {
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

pub(crate) fn linearized(py: Python<'_>, out: Linearized) -> PyResult<PyLinearized> {
    let samples = out
        .samples
        .into_iter()
        .map(|sample| Py::new(py, built_sample(py, sample)?))
        .collect::<PyResult<Vec<_>>>()?;
    let drifts = out.drifts.into_iter().map(|event| PyDriftEvent {
        chain: event.chain,
        turn: event.turn,
        kind: event.kind.as_str(),
        at: event.at,
        drifted: event.drifted,
    });
    Ok(PyLinearized {
        samples: PyList::new(py, samples)?.unbind(),
        drifts: PyList::new(py, drifts)?.unbind(),
        trained: counts_dict(py, &out.trained)?.unbind(),
        realigned: counts_dict(py, &out.realigned)?.unbind(),
        truncated: counts_dict(py, &out.truncated)?.unbind(),
    })
}

/// Samples flattened into one varlen-attention batch: see `tokentrail.export.PackedBatch`.
#[pyclass(name = "Packed", module = "tokentrail._core", frozen, get_all)]
struct PyPacked {
    tokens: Py<PyArray1<u32>>,
    cu_seqlens: Py<PyArray1<i32>>,
    position_ids: Py<PyArray1<i32>>,
    sample_index: Py<PyArray1<i32>>,
    loss_mask: Py<PyArray1<u8>>,
    logprobs: Py<PyArray1<f32>>,
    rewards: Py<PyArray1<f32>>,
    advantages: Py<PyArray1<f32>>,
    max_seqlen: usize,
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

/// The packed vectors handed to numpy as they are, without a copy.
fn packed(py: Python<'_>, out: Packed) -> PyPacked {
    PyPacked {
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

// --- SampleBuilder -------------------------------------------------------------------------------

/// Accumulates one coherent run of turns into tokens, loss mask and logprobs.
#[pyclass(name = "SampleBuilder", module = "tokentrail._core")]
struct PySampleBuilder(SampleBuilder);

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
        let span = |&Span { turn, start, end }: &Span| PySpan { turn, start, end };
        self.0.spans().iter().map(span).collect()
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

// --- Functions -----------------------------------------------------------------------------------

/// Length of the longest common prefix of two token sequences.
#[pyfunction]
fn common_prefix_len(a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<usize> {
    let (a, b) = (token_ids(a, "a")?, token_ids(b, "b")?);
    Ok(prefix::common_prefix_len(&a, &b))
}

/// One of `linearize`'s turns: `(prompt_ids, output_ids, logprobs or None)`.
type TurnArg<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, Option<Logprobs<'py>>);

/// Linearize chains of turns into samples.
///
/// `turns[i]` is `(prompt_ids, output_ids, logprobs or None)`; each chain lists turn indices
/// in order. A turn is trained on the first chain that reaches it and re-emitted as context
/// (mask 0) on later ones. A FORK closes the run and starts a new one.
#[pyfunction]
#[pyo3(signature = (
    turns, chains, *, policy = "minimal", fork_threshold = 1024, max_sample_tokens = 0
))]
fn linearize(
    py: Python<'_>,
    turns: Vec<TurnArg<'_>>,
    chains: Vec<Vec<i64>>,
    policy: &str,
    fork_threshold: i64,
    max_sample_tokens: i64,
) -> PyResult<PyLinearized> {
    // Checked in the reference's order: policy, settings, each turn in turn, then the chains.
    let settings = Settings::new(Policy::parse(policy)?, fork_threshold, max_sample_tokens)?;
    let turns = turns
        .into_iter()
        .map(|(prompt_ids, output_ids, logprobs)| {
            let prompt = token_ids(&prompt_ids, "prompt_ids")?;
            let output = token_ids(&output_ids, "output_ids")?;
            Ok(Turn::new(prompt, output, logprob_vec(logprobs))?)
        })
        .collect::<PyResult<Vec<_>>>()?;
    let out = detached(py, move || core::linearize(&turns, &chains, settings))?;
    linearized(py, out)
}

/// Per-sample inputs numpy reads as 1-D arrays of `T`.
type ArrayLike<'py, T> = PyArrayLike1<'py, T, AllowTypeChange>;

/// Pack samples into one batch for variable-length attention.
///
/// Sample `i` is `tokens[i]` (prompt and response); its last `response_lengths[i]` tokens carry
/// `loss_masks[i]` and `logprobs[i]`. Contiguous uint32/uint8/float32 arrays are read in place.
#[pyfunction]
#[pyo3(name = "pack")]
fn pack_samples(
    py: Python<'_>,
    tokens: Vec<Bound<'_, PyAny>>,
    loss_masks: Vec<ArrayLike<'_, u8>>,
    logprobs: Vec<ArrayLike<'_, f32>>,
    response_lengths: ArrayLike<'_, i64>,
    rewards: ArrayLike<'_, f32>,
) -> PyResult<PyPacked> {
    let tokens = tokens
        .iter()
        .enumerate()
        .map(|(i, ids)| held_ids(ids, &format!("tokens[{i}]")))
        .collect::<PyResult<Vec<_>>>()?;
    let loss_masks: Vec<_> = loss_masks.iter().map(Held::like).collect();
    let logprobs: Vec<_> = logprobs.iter().map(Held::like).collect();
    let (response_lengths, rewards) = (Held::like(&response_lengths), Held::like(&rewards));

    let tokens: Vec<&[u32]> = tokens.iter().map(Held::as_slice).collect();
    let loss_masks: Vec<&[u8]> = loss_masks.iter().map(Held::as_slice).collect();
    let logprobs: Vec<&[f32]> = logprobs.iter().map(Held::as_slice).collect();
    let (response_lengths, rewards) = (response_lengths.as_slice(), rewards.as_slice());
    let out = detached(py, || {
        pack::pack(&tokens, &loss_masks, &logprobs, response_lengths, rewards)
    })?;
    Ok(packed(py, out))
}
