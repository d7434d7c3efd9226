//! The packing binding: `pack`, which flattens samples into one varlen-attention batch.
use pyo3::prelude::*;

use super::convert::{held_ids, ArrayLike, Held};
use super::detached;
use super::records::{packed, PyPacked};
use crate::pack as core;

/// Pack samples into one batch for variable-length attention.
///
/// Sample `i` is `tokens[i]` (prompt and response); its last `response_lengths[i]` tokens carry
/// `loss_masks[i]` and `logprobs[i]`. Contiguous uint32/uint8/float32 arrays are read in place.
#[pyfunction]
#[pyo3(name = "pack")]
pub(super) fn pack_samples(
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
        core::pack(&tokens, &loss_masks, &logprobs, response_lengths, rewards)
    })?;
    Ok(packed(py, out))
}
