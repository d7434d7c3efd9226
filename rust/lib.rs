//! tokentrail's hot path: prefix diffing, drift classification, loss masks, linearization,
//! packing.
//!
//! The algorithm modules are plain Rust; `python` is the only one that knows about Python.
pub mod builder;
pub mod counts;
pub mod drift;
pub mod error;
pub mod linearize;
pub mod pack;
pub mod prefix;
mod python;

/// The extension module `tokentrail._core`; `python::register` fills it.
#[pyo3::pymodule]
fn _core(m: &pyo3::Bound<'_, pyo3::types::PyModule>) -> pyo3::PyResult<()> {
    python::register(m)
}
