//! The binding of the byte-level detokenizer: `tokentrail._core.Detokenizer`.
use pyo3::prelude::*;

use super::convert::token_ids;
use super::TokenizerError;
use crate::detokenize::Detokenizer;

/// Past this many ids a decode lets go of the interpreter while it works.
const DETACHED_IDS: usize = 16 * 1024;

/// The text of token ids, as `tokenizers`' `decode` gives it with the special tokens kept, for
/// a tokenizer whose decoder is `ByteLevel`.
#[pyclass(name = "Detokenizer", module = "tokentrail._core", frozen)]
pub(super) struct PyDetokenizer {
    inner: Detokenizer,
}

#[pymethods]
impl PyDetokenizer {
    /// Raises `TokenizerError` for a tokenizer.json that does not load or whose decoder is
    /// not `ByteLevel`, saying why.
    #[new]
    fn new(py: Python<'_>, tokenizer_json: &str) -> PyResult<Self> {
        py.detach(|| Detokenizer::from_json(tokenizer_json))
            .map(|inner| PyDetokenizer { inner })
            .map_err(TokenizerError::new_err)
    }

    /// The text of `ids` (a list of ints or an integer array).
    fn decode(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<String> {
        let ids = token_ids(ids, "ids")?;
        if ids.len() > DETACHED_IDS {
            return Ok(py.detach(|| self.inner.decode(&ids)));
        }
        Ok(self.inner.decode(&ids))
    }

    /// How many ids the table holds (one past the largest id with a token).
    fn __len__(&self) -> usize {
        self.inner.len()
    }
}
