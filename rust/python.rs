//! The Python binding `tokentrail._core`: convert the arguments, call the core, convert back.
//!
//! Argument checks follow `tokentrail.reference` to the message, and happen in the order the
//! reference meets them, so either backend raises the same exception for the same input.
use numpy::{
    Element, IntoPyArray, PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::marker::Ungil;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

use crate::builder::{checked_logprobs, BuiltSample, SampleBuilder, Span};
use crate::counts::Counts;
use crate::drift::{Drift, DriftKind, Policy};
use crate::error::Error;
use crate::linearize::{self as core, DriftEvent, Linearized, Turn};
use crate::prefix;

pyo3::import_exception!(tokentrail.errors, TokenIdError);
pyo3::import_exception!(tokentrail.errors, LogprobLengthError);
pyo3::import_exception!(tokentrail.errors, PolicyError);

impl From<Error> for PyErr {
    fn from(err: Error) -> PyErr {
        let message = err.to_string();
        match err {
            Error::TokenId(_) => TokenIdError::new_err(message),
            Error::LogprobLength { .. } => LogprobLengthError::new_err(message),
            Error::UnknownPolicy(_)
            | Error::Negative { .. }
            | Error::Fork { .. }
            | Error::TurnOutOfRange { .. } => PolicyError::new_err(message),
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
    m.add_function(wrap_pyfunction!(common_prefix_len, m)?)?;
    m.add_function(wrap_pyfunction!(linearize, m)?)?;
    Ok(())
}

/// Run `work` with the GIL released; its error becomes the matching Python exception.
fn detached<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    F: Ungil + FnOnce() -> Result<T, Error>,
    Result<T, Error>: Ungil,
{
    py.detach(work).map_err(PyErr::from)
}

// ---------------------------------------------------------------------------------------------
// Arguments

/// A Python int as `i64`, saturating beyond its range: the reference compares any int.
struct Int(i64);

impl<'a, 'py> FromPyObject<'a, 'py> for Int {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match obj.extract::<i64>() {
            Ok(value) => Ok(Int(value)),
            Err(err) if err.is_instance_of::<PyOverflowError>(obj.py()) => {
                Ok(Int(if obj.gt(0)? { i64::MAX } else { i64::MIN }))
            }
            Err(err) => Err(err),
        }
    }
}

/// Python truthiness, as the reference's `if trained:` reads it.
struct Truthy(bool);

impl<'a, 'py> FromPyObject<'a, 'py> for Truthy {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Truthy(obj.is_truthy()?))
    }
}

/// A policy argument. An unknown one is kept as its error: the reference refuses it only when
/// it builds a builder, which `linearize` does not do for an empty list of chains.
struct PolicyArg(Result<Policy, Error>);

impl PolicyArg {
    const MINIMAL: PolicyArg = PolicyArg(Ok(Policy::Minimal));

    fn get(&self) -> Result<Policy, Error> {
        self.0.clone()
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for PolicyArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let known = match obj.cast::<PyString>() {
            Ok(name) => Policy::parse(name.to_str()?).ok(),
            Err(_) => None,
        };
        Ok(PolicyArg(match known {
            Some(policy) => Ok(policy),
            None => Err(Error::UnknownPolicy(obj.repr()?.to_string())),
        }))
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(obj.get_type().name()?.to_string())
}

/// Token ids from a 1-D integer numpy array, or a list or tuple of ints (numpy ints too, bools
/// not), each in `[0, 2**32)`. `what` names the argument in the error.
fn token_ids(ids: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    if let Ok(array) = ids.cast::<PyUntypedArray>() {
        return array_ids(array, what);
    }
    if let Ok(list) = ids.cast::<PyList>() {
        return list
            .iter()
            .enumerate()
            .map(|(pos, x)| token_id(&x, what, pos))
            .collect();
    }
    if let Ok(tuple) = ids.cast::<PyTuple>() {
        return tuple
            .iter()
            .enumerate()
            .map(|(pos, x)| token_id(&x, what, pos))
            .collect();
    }
    Err(token_error(format!(
        "{what}: expected a list of ints, got {}",
        type_name(ids)?
    )))
}

fn token_error(message: String) -> PyErr {
    Error::TokenId(message).into()
}

fn token_id(x: &Bound<'_, PyAny>, what: &str, pos: usize) -> PyResult<u32> {
    let is_int = x.is_exact_instance_of::<PyInt>()
        || (!x.is_instance_of::<PyBool>()
            && (x.is_instance_of::<PyInt>() || x.is_instance(numpy_integer(x.py())?)?));
    if !is_int {
        return Err(token_error(format!(
            "{what}[{pos}]: expected an int, got {}",
            type_name(x)?
        )));
    }
    x.extract::<u32>().or_else(|_| {
        let shown = x.call_method1("__format__", ("",))?;
        Err(token_error(format!(
            "{what}[{pos}]: id {shown} is outside [0, 2**32)"
        )))
    })
}

fn numpy_integer(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static INTEGER: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    INTEGER.import(py, "numpy", "integer")
}

fn array_ids(array: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<Vec<u32>> {
    let dtype = array.dtype();
    let kind = dtype.kind();
    if array.ndim() != 1 || !matches!(kind, b'i' | b'u') {
        return Err(token_error(format!(
            "{what}: expected a 1-D integer array, got {}{}",
            dtype.str()?,
            array.getattr("shape")?.str()?
        )));
    }
    if let Ok(ids) = array.cast::<PyArray1<u32>>() {
        let ids = ids.readonly();
        return Ok(match ids.as_slice() {
            Ok(slice) => slice.to_vec(),
            Err(_) => ids.as_array().to_vec(),
        });
    }
    let converted = narrowed::<i64>(array)
        .or_else(|| narrowed::<i32>(array))
        .or_else(|| narrowed::<u64>(array))
        .or_else(|| narrowed::<u16>(array))
        .or_else(|| narrowed::<i16>(array))
        .or_else(|| narrowed::<u8>(array))
        .or_else(|| narrowed::<i8>(array));
    match converted {
        Some(Some(ids)) => Ok(ids),
        Some(None) => Err(token_error(format!("{what}: ids must lie in [0, 2**32)"))),
        // Not in native byte order: let numpy swap it, then read it again.
        None => {
            let wide = if kind == b'u' { "uint64" } else { "int64" };
            array_ids(array.call_method1("astype", (wide,))?.cast()?, what)
        }
    }
}

/// The ids of `array` if its dtype is `T`: `Some(None)` when one lies outside `u32`.
fn narrowed<T>(array: &Bound<'_, PyUntypedArray>) -> Option<Option<Vec<u32>>>
where
    T: Element + Copy,
    u32: TryFrom<T>,
{
    let ids = array.cast::<PyArray1<T>>().ok()?.readonly();
    Some(
        ids.as_array()
            .iter()
            .map(|&id| u32::try_from(id).ok())
            .collect(),
    )
}

/// Logprobs as the reference reads them: `None`, or `float(x)` of every item of an iterable
/// (a list, a tuple, a numpy array). Length is checked later, by the core.
fn logprob_values(logprobs: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<f32>>> {
    let Some(logprobs) = logprobs.filter(|obj| !obj.is_none()) else {
        return Ok(None);
    };
    if let Ok(array) = logprobs.cast::<PyArray1<f32>>() {
        return Ok(Some(array.readonly().as_array().to_vec()));
    }
    if let Ok(array) = logprobs.cast::<PyArray1<f64>>() {
        let array = array.readonly();
        return Ok(Some(array.as_array().iter().map(|&x| x as f32).collect()));
    }
    let float = logprobs.py().get_type::<PyFloat>();
    let mut values = Vec::with_capacity(logprobs.len().unwrap_or(0));
    for item in logprobs.try_iter()? {
        let item = item?;
        let value = match item.cast_exact::<PyFloat>() {
            Ok(x) => x.value(),
            Err(_) => float.call1((item,))?.extract::<f64>()?,
        };
        values.push(value as f32);
    }
    Ok(Some(values))
}

// ---------------------------------------------------------------------------------------------
// Records

/// How an incoming prompt relates to the tokens a builder holds.
#[pyclass(name = "Drift", module = "tokentrail._core", frozen, eq, hash)]
#[derive(PartialEq, Eq, Hash)]
struct PyDrift(Drift);

#[pymethods]
impl PyDrift {
    #[new]
    fn new(kind: &str, at: usize, drifted: usize) -> PyResult<Self> {
        Ok(PyDrift(Drift {
            kind: drift_kind(kind)?,
            at,
            drifted,
        }))
    }

    #[getter]
    fn kind(&self) -> &'static str {
        self.0.kind.as_str()
    }

    #[getter]
    fn at(&self) -> usize {
        self.0.at
    }

    #[getter]
    fn drifted(&self) -> usize {
        self.0.drifted
    }

    fn __repr__(&self) -> String {
        let Drift { kind, at, drifted } = self.0;
        format!(
            "Drift(kind='{}', at={at}, drifted={drifted})",
            kind.as_str()
        )
    }
}

fn drift_kind(name: &str) -> PyResult<DriftKind> {
    DriftKind::parse(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown drift kind {name:?}; expected 'clean', 'realign' or 'fork'"
        ))
    })
}

/// One turn's sampled output inside a builder: tokens [start, end).
#[pyclass(name = "Span", module = "tokentrail._core", frozen, eq)]
#[derive(PartialEq)]
struct PySpan(Span);

#[pymethods]
impl PySpan {
    #[new]
    fn new(turn: i64, start: usize, end: usize) -> Self {
        PySpan(Span { turn, start, end })
    }

    #[getter]
    fn turn(&self) -> i64 {
        self.0.turn
    }

    #[getter]
    fn start(&self) -> usize {
        self.0.start
    }

    #[getter]
    fn end(&self) -> usize {
        self.0.end
    }

    fn __repr__(&self) -> String {
        let Span { turn, start, end } = self.0;
        format!("Span(turn={turn}, start={start}, end={end})")
    }
}

/// A drift decision taken while adding a turn to a run of a chain.
#[pyclass(name = "DriftEvent", module = "tokentrail._core", frozen, eq, hash)]
#[derive(PartialEq, Eq, Hash)]
struct PyDriftEvent(DriftEvent);

#[pymethods]
impl PyDriftEvent {
    #[new]
    fn new(chain: usize, turn: usize, kind: &str, at: usize, drifted: usize) -> PyResult<Self> {
        let kind = drift_kind(kind)?;
        Ok(PyDriftEvent(DriftEvent {
            chain,
            turn,
            kind,
            at,
            drifted,
        }))
    }

    #[getter]
    fn chain(&self) -> usize {
        self.0.chain
    }

    #[getter]
    fn turn(&self) -> usize {
        self.0.turn
    }

    #[getter]
    fn kind(&self) -> &'static str {
        self.0.kind.as_str()
    }

    #[getter]
    fn at(&self) -> usize {
        self.0.at
    }

    #[getter]
    fn drifted(&self) -> usize {
        self.0.drifted
    }

    fn __repr__(&self) -> String {
        let DriftEvent {
            chain,
            turn,
            kind,
            at,
            drifted,
        } = self.0;
        format!(
            "DriftEvent(chain={chain}, turn={turn}, kind='{}', at={at}, drifted={drifted})",
            kind.as_str()
        )
    }
}

/// One linearized run: `tokens` in full, `loss_mask`/`logprobs` over the response part.
#[pyclass(name = "BuiltSample", module = "tokentrail._core")]
struct PyBuiltSample {
    #[pyo3(get)]
    tokens: Py<PyArray1<u32>>,
    #[pyo3(get)]
    loss_mask: Py<PyArray1<u8>>,
    #[pyo3(get)]
    logprobs: Py<PyArray1<f32>>,
    #[pyo3(get)]
    response_start: usize,
    #[pyo3(get)]
    truncated: bool,
    #[pyo3(get)]
    turns: Py<PyList>,
    #[pyo3(get)]
    trained: Py<PyDict>,
    #[pyo3(get)]
    realigned: Py<PyDict>,
    #[pyo3(get)]
    truncated_tokens: Py<PyDict>,
    #[pyo3(get, set)]
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
    let dict = PyDict::new(py);
    for (turn, n) in counts.iter() {
        dict.set_item(turn, n)?;
    }
    Ok(dict)
}

/// Every sample of a set of chains, with the drift decisions taken on the way.
#[pyclass(name = "Linearized", module = "tokentrail._core", frozen)]
struct PyLinearized {
    #[pyo3(get)]
    samples: Py<PyList>,
    #[pyo3(get)]
    drifts: Py<PyList>,
    #[pyo3(get)]
    trained: Py<PyDict>,
    #[pyo3(get)]
    realigned: Py<PyDict>,
    #[pyo3(get)]
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

fn linearized(py: Python<'_>, out: Linearized) -> PyResult<PyLinearized> {
    let samples = out
        .samples
        .into_iter()
        .map(|sample| Py::new(py, built_sample(py, sample)?))
        .collect::<PyResult<Vec<_>>>()?;
    let drifts = out.drifts.into_iter().map(PyDriftEvent);
    Ok(PyLinearized {
        samples: PyList::new(py, samples)?.unbind(),
        drifts: PyList::new(py, drifts)?.unbind(),
        trained: counts_dict(py, &out.trained)?.unbind(),
        realigned: counts_dict(py, &out.realigned)?.unbind(),
        truncated: counts_dict(py, &out.truncated)?.unbind(),
    })
}

// ---------------------------------------------------------------------------------------------
// SampleBuilder

/// Accumulates one coherent run of turns into tokens, loss mask and logprobs.
#[pyclass(name = "SampleBuilder", module = "tokentrail._core")]
struct PySampleBuilder(SampleBuilder);

#[pymethods]
impl PySampleBuilder {
    #[new]
    #[pyo3(
        signature = (policy = PolicyArg::MINIMAL, fork_threshold = Int(1024)),
        text_signature = "(policy='minimal', fork_threshold=1024)"
    )]
    fn new(policy: PolicyArg, fork_threshold: Int) -> PyResult<Self> {
        Ok(PySampleBuilder(SampleBuilder::new(
            policy.get()?,
            fork_threshold.0,
        )?))
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

    #[pyo3(
        signature = (prompt_ids, output_len = Int(0)),
        text_signature = "($self, prompt_ids, output_len=0)"
    )]
    fn classify(&self, prompt_ids: &Bound<'_, PyAny>, output_len: Int) -> PyResult<PyDrift> {
        let prompt = token_ids(prompt_ids, "prompt_ids")?;
        // A negative length gates like 0: both pass any threshold the gate is tested against.
        let output_len = usize::try_from(output_len.0).unwrap_or(0);
        Ok(PyDrift(self.0.classify(&prompt, output_len)))
    }

    /// Append a turn, healing a REALIGN. A FORK is refused: start a new builder.
    #[pyo3(
        signature = (prompt_ids, output_ids, logprobs = None, *, trained = Truthy(true), turn = 0),
        text_signature = "($self, prompt_ids, output_ids, logprobs=None, *, trained=True, turn=0)"
    )]
    fn append_turn(
        &mut self,
        prompt_ids: &Bound<'_, PyAny>,
        output_ids: &Bound<'_, PyAny>,
        logprobs: Option<&Bound<'_, PyAny>>,
        trained: Truthy,
        turn: i64,
    ) -> PyResult<PyDrift> {
        let prompt = token_ids(prompt_ids, "prompt_ids")?;
        let output = token_ids(output_ids, "output_ids")?;
        let logprobs = logprob_values(logprobs)?;
        let drift = self
            .0
            .append_turn(&prompt, &output, logprobs.as_deref(), trained.0, turn)?;
        Ok(PyDrift(drift))
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
        self.0.spans().iter().copied().map(PySpan).collect()
    }

    #[getter]
    fn realigned<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        counts_dict(py, self.0.realigned())
    }

    /// Cut the sample to `max_sample_tokens` (0: no limit) and return its arrays.
    #[pyo3(
        signature = (max_sample_tokens = Int(0)),
        text_signature = "($self, max_sample_tokens=0)"
    )]
    fn finish(&self, py: Python<'_>, max_sample_tokens: Int) -> PyResult<PyBuiltSample> {
        built_sample(py, self.0.finish(max_sample_tokens.0)?)
    }
}

// ---------------------------------------------------------------------------------------------
// Functions

/// Length of the longest common prefix of two token sequences.
#[pyfunction]
fn common_prefix_len(a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<usize> {
    let (a, b) = (token_ids(a, "a")?, token_ids(b, "b")?);
    Ok(prefix::common_prefix_len(&a, &b))
}

/// Linearize chains of turns into samples.
///
/// `turns[i]` is `(prompt_ids, output_ids, logprobs or None)`; each chain lists turn indices
/// in order. A turn is trained on the first chain that reaches it and re-emitted as context
/// (mask 0) on later ones. A FORK closes the run and starts a new one.
#[pyfunction]
#[pyo3(
    signature = (
        turns, chains, *, policy = PolicyArg::MINIMAL, fork_threshold = Int(1024),
        max_sample_tokens = Int(0)
    ),
    text_signature = "(turns, chains, *, policy='minimal', fork_threshold=1024, max_sample_tokens=0)"
)]
fn linearize(
    py: Python<'_>,
    turns: &Bound<'_, PyAny>,
    chains: &Bound<'_, PyAny>,
    policy: PolicyArg,
    fork_threshold: Int,
    max_sample_tokens: Int,
) -> PyResult<PyLinearized> {
    let (fork_threshold, max_sample_tokens) = (fork_threshold.0, max_sample_tokens.0);
    let inputs = Inputs::extract(turns, chains, &policy, fork_threshold)
        .map_err(|bad| bad.first_error(&policy, fork_threshold, max_sample_tokens))?;
    // Every chain passed the policy check, or there are no chains and no policy is used.
    let policy = policy.get().unwrap_or(Policy::Minimal);
    let out = detached(py, move || {
        core::linearize(
            &inputs.turns,
            &inputs.chains,
            policy,
            fork_threshold,
            max_sample_tokens,
        )
    })?;
    linearized(py, out)
}

/// Turns and chains read out of Python as the reference walks them: chain by chain, each turn
/// when a chain first names it. Turns no chain names stay empty and are never read.
#[derive(Default)]
struct Inputs {
    turns: Vec<Turn>,
    read: Vec<bool>,
    count: Option<usize>,
    chains: Vec<Vec<usize>>,
}

/// Input the reference refuses, with how far its walk got: `inputs.chains` ends with the part
/// of the chain it was in, and `classified` holds the turn it had classified but not appended.
struct BadInput {
    err: PyErr,
    inputs: Inputs,
    classified: Option<Classified>,
}

/// The prompt and output ids of a turn the reference has classified but not yet appended.
type Classified = (Vec<u32>, Vec<u32>);

/// Why the walk stopped, with the turn it stopped in when that turn was classified.
type Refusal = (PyErr, Option<Classified>);

impl Inputs {
    fn extract(
        turns: &Bound<'_, PyAny>,
        chains: &Bound<'_, PyAny>,
        policy: &PolicyArg,
        fork_threshold: i64,
    ) -> Result<Inputs, Box<BadInput>> {
        let mut inputs = Inputs::default();
        match inputs.walk(turns, chains, policy, fork_threshold) {
            Ok(()) => Ok(inputs),
            Err((err, classified)) => Err(Box::new(BadInput {
                err,
                inputs,
                classified,
            })),
        }
    }

    fn walk(
        &mut self,
        turns: &Bound<'_, PyAny>,
        chains: &Bound<'_, PyAny>,
        policy: &PolicyArg,
        fork_threshold: i64,
    ) -> Result<(), Refusal> {
        let early = |err: PyErr| (err, None);
        for (c, chain) in chains.try_iter().map_err(early)?.enumerate() {
            self.chains.push(Vec::new());
            let chain = chain.map_err(early)?;
            // The reference builds a builder per chain; only the first can refuse the settings.
            if c == 0 {
                policy
                    .get()
                    .and_then(|policy| SampleBuilder::new(policy, fork_threshold))
                    .map_err(|err| early(err.into()))?;
            }
            for t in chain.try_iter().map_err(early)? {
                let t = t
                    .and_then(|t| self.turn_index(turns, c, &t))
                    .map_err(early)?;
                if !self.read[t] {
                    self.turns[t] = read_turn(turns, t)?;
                    self.read[t] = true;
                }
                self.chains.last_mut().expect("pushed above").push(t);
            }
        }
        Ok(())
    }

    /// `t` as an index into `turns`, or the reference's `PolicyError` when out of range.
    fn turn_index(
        &mut self,
        turns: &Bound<'_, PyAny>,
        chain: usize,
        t: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let count = match self.count {
            Some(count) => count,
            None => {
                let count = turns.len()?;
                self.turns = vec![Turn::default(); count];
                self.read = vec![false; count];
                self.count = Some(count);
                count
            }
        };
        let Int(index) = t.extract()?;
        match usize::try_from(index) {
            Ok(index) if index < count => Ok(index),
            _ => Err(Error::TurnOutOfRange {
                chain,
                turn: index,
                turns: count,
            }
            .into()),
        }
    }
}

/// `turns[t]` unpacked and checked in the reference's order: output ids, prompt ids (both
/// before the turn is classified), then logprobs (when it is appended).
fn read_turn(turns: &Bound<'_, PyAny>, t: usize) -> Result<Turn, Refusal> {
    let early = |err: PyErr| (err, None);
    let [prompt_ids, output_ids, logprobs] = turns
        .get_item(t)
        .and_then(|turn| unpack3(&turn))
        .map_err(early)?;
    let output = token_ids(&output_ids, "output_ids").map_err(early)?;
    let prompt = token_ids(&prompt_ids, "prompt_ids").map_err(early)?;
    let logprobs = logprob_values(Some(&logprobs)).and_then(|values| {
        checked_logprobs(values.as_deref(), output.len())?;
        Ok(values.filter(|values| !values.is_empty()))
    });
    match logprobs {
        Ok(logprobs) => Ok(Turn {
            prompt,
            output,
            logprobs,
        }),
        Err(err) => Err((err, Some((prompt, output)))),
    }
}

/// `a, b, c = item`, with Python's errors for the wrong number of values.
fn unpack3<'py>(item: &Bound<'py, PyAny>) -> PyResult<[Bound<'py, PyAny>; 3]> {
    let mut values = item.try_iter().map_err(|err| {
        if err.is_instance_of::<PyTypeError>(item.py()) {
            match type_name(item) {
                Ok(name) => {
                    PyTypeError::new_err(format!("cannot unpack non-iterable {name} object"))
                }
                Err(err) => err,
            }
        } else {
            err
        }
    })?;
    let mut next = |got: usize| -> PyResult<Bound<'py, PyAny>> {
        values.next().transpose()?.ok_or_else(|| {
            PyValueError::new_err(format!(
                "not enough values to unpack (expected 3, got {got})"
            ))
        })
    };
    let unpacked = [next(0)?, next(1)?, next(2)?];
    if values.next().transpose()?.is_some() {
        return Err(PyValueError::new_err(
            "too many values to unpack (expected 3)",
        ));
    }
    Ok(unpacked)
}

impl BadInput {
    /// The error the reference raises first. A negative `max_sample_tokens` is refused when a
    /// run with output closes; if the walk closed one before reaching the bad input, that
    /// refusal comes first.
    fn first_error(self, policy: &PolicyArg, fork_threshold: i64, max_sample_tokens: i64) -> PyErr {
        let Ok(policy) = policy.get() else {
            return self.err;
        };
        if max_sample_tokens >= 0 {
            return self.err;
        }
        let Some((current, before)) = self.inputs.chains.split_last() else {
            return self.err;
        };
        let turns = &self.inputs.turns;
        let visits = current
            .iter()
            .map(|&t| (turns[t].prompt.as_slice(), turns[t].output.as_slice()))
            .chain(
                self.classified
                    .as_ref()
                    .map(|(prompt, output)| (prompt.as_slice(), output.as_slice())),
            );
        let closed = before.iter().any(|chain| !chain.is_empty())
            || matches!(
                core::first_fork(policy, fork_threshold, visits),
                Ok(Some(_))
            );
        if closed {
            Error::Negative {
                setting: "max_sample_tokens",
                value: max_sample_tokens,
            }
            .into()
        } else {
            self.err
        }
    }
}
