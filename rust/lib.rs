//! tokentrail's hot path: prefix diffing, drift classification, loss masks, linearization,
//! packing.
//!
//! The algorithm modules are plain Rust; only the binding modules (`python`, `python_*`) know
//! about Python.
pub mod builder;
pub mod counts;
pub mod drift;
pub mod error;
pub mod linearize;
pub mod pack;
pub mod prefix;
mod python;
mod python_store;
mod python_tokenize;
pub mod store;
pub mod tokenize;

/// The extension module `tokentrail._core`; the binding modules' `register` fill it.
#[pyo3::pymodule]
fn _core(m: &pyo3::Bound<'_, pyo3::types::PyModule>) -> pyo3::PyResult<()> {
    python::register(m)?;
    python_store::register(m)?;
    python_tokenize::register(m)
}
