//! Arguments read out of Python: token ids, logprobs, turns and per-sample arrays, refusing
//! what is not an id with the reference's message; and the ledgers handed back as dicts.
use std::fmt::Display;

use numpy::{
    AllowTypeChange, Element, PyArray1, PyArrayDescrMethods, PyArrayLike1, PyArrayMethods,
    PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyBool, PyDict, PyInt, PyList, PyTuple};

use crate::counts::Counts;
use crate::error::Error;
use crate::linearize::Turn;

/// Token ids from a 1-D integer numpy array or a list or tuple of ints (numpy ints too, bools
/// not), each in `[0, 2**32)`. `what` names the argument in the `TokenIdError`.
pub(super) fn token_ids(ids: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
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
                Ok(n) if id.is_exact_instance_of::<PyInt>() || !is_boolean(&id)? => return Ok(n),
                Err(err) if err.is_instance_of::<PyOverflowError>(py) => {
                    format!("id {id} is outside [0, 2**32)")
                }
                _ => format!("expected an int, got {}", id.get_type().name()?),
            };
            Err(token_error(format!("{what}[{pos}]"), problem))
        })
        .collect()
}

/// Python's bool, or numpy's `np.bool_`, which numpy before 2.3 (all there is for Python
/// 3.10) still reads as an index.
fn is_boolean(id: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(id.is_instance_of::<PyBool>() || id.get_type().name()? == "bool")
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

/// Values numpy reads as a 1-D array of `T` (`asarray(values, dtype)`): such an array in
/// place, anything else converted.
pub(super) type ArrayLike<'py, T> = PyArrayLike1<'py, T, AllowTypeChange>;

/// Logprobs as numpy reads them: a float32 array in place, other floats converted.
pub(super) type Logprobs<'py> = ArrayLike<'py, f32>;

/// The logprobs, copied out of Python.
pub(super) fn logprob_vec(logprobs: Option<Logprobs<'_>>) -> Option<Vec<f32>> {
    logprobs.map(|logprobs| logprobs.as_array().to_vec())
}

/// One of `linearize`'s turns: `(prompt_ids, output_ids, logprobs or None)`.
pub(super) type TurnArg<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, Option<Logprobs<'py>>);

/// A `linearize` turn read out of Python; the core checks its logprobs against its output.
pub(super) fn turn((prompt_ids, output_ids, logprobs): TurnArg<'_>) -> PyResult<Turn> {
    let prompt = token_ids(&prompt_ids, "prompt_ids")?;
    let output = token_ids(&output_ids, "output_ids")?;
    Ok(Turn::new(prompt, output, logprob_vec(logprobs))?)
}

/// A 1-D array's elements: read in place from a contiguous numpy array, copied otherwise.
pub(super) enum Held<'py, T: Element> {
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
    pub(super) fn like(values: &ArrayLike<'py, T>) -> Self {
        Held::new((**values).clone())
    }

    pub(super) fn as_slice(&self) -> &[T] {
        match self {
            Held::InPlace(array) => array.as_slice().expect("held arrays are contiguous"),
            Held::Copied(values) => values,
        }
    }
}

/// Token ids: a uint32 array in place, anything else through `token_ids`.
pub(super) fn held_ids<'py>(ids: &Bound<'py, PyAny>, what: &str) -> PyResult<Held<'py, u32>> {
    match ids.cast::<PyArray1<u32>>() {
        Ok(array) => Ok(Held::new(array.readonly())),
        Err(_) => token_ids(ids, what).map(Held::Copied),
    }
}

/// A ledger of token counts per turn as a `{turn: count}` dict.
pub(super) fn counts_dict<'py>(py: Python<'py>, counts: &Counts) -> PyResult<Bound<'py, PyDict>> {
    counts.iter().into_py_dict(py)
}
