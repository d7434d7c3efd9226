//! The Python binding `tokentrail._core`: the module's contents, the error mapping and the
//! GIL-release helper.
//!
//! Each submodule is thin: convert the arguments (`convert`), call the core, convert back
//! (`records`). The core refuses bad settings, logprobs and chains before it does any work.
use pyo3::marker::Ungil;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::drift::{DriftKind, Policy};
use crate::error::Error;
use crate::tape::Status;

mod body;
mod builder;
mod convert;
mod detokenize;
mod http_chunks;
mod numbers;
mod pack;
mod records;
mod rows;
mod sglang_run;
mod sse_run;
mod store;
mod tokenize;

pyo3::import_exception!(tokentrail.errors, TokenIdError);
pyo3::import_exception!(tokentrail.errors, LogprobLengthError);
pyo3::import_exception!(tokentrail.errors, PolicyError);
pyo3::import_exception!(tokentrail.errors, PackError);
pyo3::import_exception!(tokentrail.errors, TokenizerError);
pyo3::import_exception!(tokentrail.errors, ReplayError);
pyo3::import_exception!(tokentrail.errors, BodyShapeError);
pyo3::import_exception!(tokentrail.errors, ChunkedBodyError);

/// tokentrail's Rust hot path: the same names and semantics as `tokentrail.core.reference`.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The package's one version: Cargo.toml's, which maturin also writes into the wheel.
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CLEAN", DriftKind::Clean.as_str())?;
    m.add("REALIGN", DriftKind::Realign.as_str())?;
    m.add("FORK", DriftKind::Fork.as_str())?;
    m.add("POLICIES", PyTuple::new(m.py(), Policy::NAMES)?)?;
    m.add("REPLAY_STATUS", PyTuple::new(m.py(), Status::NAMES)?)?;
    m.add_class::<records::PyDrift>()?;
    m.add_class::<records::PySpan>()?;
    m.add_class::<builder::PySampleBuilder>()?;
    m.add_class::<records::PyBuiltSample>()?;
    m.add_class::<records::PyDriftEvent>()?;
    m.add_class::<records::PyLinearized>()?;
    m.add_class::<records::PyPacked>()?;
    m.add_class::<store::PyTurnStore>()?;
    m.add_class::<tokenize::PyIncrementalTokenizer>()?;
    m.add_class::<detokenize::PyDetokenizer>()?;
    m.add_class::<body::PyBodyIndex>()?;
    m.add_function(wrap_pyfunction!(body::index_body, m)?)?;
    m.add_function(wrap_pyfunction!(body::diff_bodies, m)?)?;
    m.add_function(wrap_pyfunction!(builder::common_prefix_len, m)?)?;
    m.add_function(wrap_pyfunction!(builder::linearize, m)?)?;
    m.add_function(wrap_pyfunction!(pack::pack_samples, m)?)?;
    m.add_function(wrap_pyfunction!(numbers::number_array, m)?)?;
    m.add_function(wrap_pyfunction!(sglang_run::sglang_run, m)?)?;
    m.add_function(wrap_pyfunction!(sse_run::sse_run, m)?)?;
    m.add_function(wrap_pyfunction!(http_chunks::http_chunks, m)?)?;
    Ok(())
}

/// Each variant becomes its named `ValueError` subclass from `tokentrail.errors`, carrying the
/// core's message.
impl From<Error> for PyErr {
    fn from(err: Error) -> PyErr {
        let message = err.to_string();
        match err {
            Error::TokenId(_) => TokenIdError::new_err(message),
            Error::LogprobLength { .. } => LogprobLengthError::new_err(message),
            Error::UnknownPolicy { .. }
            | Error::Negative { .. }
            | Error::Fork { .. }
            | Error::TurnOutOfRange { .. }
            | Error::NoSuchTurn { .. } => PolicyError::new_err(message),
            Error::PackCount { .. }
            | Error::ResponseLength { .. }
            | Error::PackLength { .. }
            | Error::PackRows { .. }
            | Error::PackTooLong { .. } => PackError::new_err(message),
            Error::Tokenizer(_) => TokenizerError::new_err(message),
            Error::Replay(_) => ReplayError::new_err(message),
            Error::Chunked(_) => ChunkedBodyError::new_err(message),
        }
    }
}

/// Run `work` with the GIL released; its error becomes the matching Python exception.
fn detached<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    F: Ungil + FnOnce() -> Result<T, Error>,
    Result<T, Error>: Ungil,
{
    py.detach(work).map_err(PyErr::from)
}
