//! The packing binding: `pack`, which flattens samples into one varlen-attention batch.
use numpy::PyReadonlyArray3;
use pyo3::prelude::*;

use super::convert::{held_ids, ArrayLike, Held};
use super::detached;
use super::records::{packed, PyPacked};
use super::rows::{column_array, row_lists, RowLists};
use crate::pack as core;
use crate::tape::Column;

/// Pack samples into one batch for variable-length attention.
///
/// Sample `i` is `tokens[i]` (prompt and response); its last `response_lengths[i]` tokens carry
/// `loss_masks[i]` and `logprobs[i]`. Contiguous uint32/uint8/float32 arrays are read in place.
/// `routed_experts` and `indexer_topk`, when given, hold one 3-D array per sample with a row
/// per token, packed into `[tokens, layers, width]`.
#[pyfunction]
#[pyo3(name = "pack")]
#[pyo3(signature = (
    tokens, loss_masks, logprobs, response_lengths, rewards, routed_experts = None,
    indexer_topk = None
))]
#[allow(clippy::too_many_arguments)]
pub(super) fn pack_samples(
    py: Python<'_>,
    tokens: Vec<Bound<'_, PyAny>>,
    loss_masks: Vec<ArrayLike<'_, u8>>,
    logprobs: Vec<ArrayLike<'_, f32>>,
    response_lengths: ArrayLike<'_, i64>,
    rewards: ArrayLike<'_, f32>,
    routed_experts: Option<Vec<Bound<'_, PyAny>>>,
    indexer_topk: Option<Vec<Bound<'_, PyAny>>>,
) -> PyResult<PyPacked> {
    let tokens = tokens
        .iter()
        .enumerate()
        .map(|(i, ids)| held_ids(ids, &format!("tokens[{i}]")))
        .collect::<PyResult<Vec<_>>>()?;
    let replay = [
        ("routed_experts", routed_experts),
        ("indexer_topk", indexer_topk),
    ];
    let replay = replay
        .into_iter()
        .map(|(what, values)| match values {
            Some(values) if !values.is_empty() => Ok(Some((what, row_lists(&values, what)?))),
            Some(_) => Ok(Some((what, (RowLists::U8(Vec::new()), [0, 0])))),
            None => Ok(None),
        })
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
    let lengths: Vec<usize> = tokens.iter().map(|ids| ids.len()).collect();
    let mut arrays = [None, None];
    for (slot, entry) in arrays.iter_mut().zip(replay) {
        if let Some((what, (lists, row))) = entry {
            *slot = packed_rows(py, what, lists, row, &lengths)?;
        }
    }
    Ok(packed(py, out, arrays))
}

/// The samples' rows one after another as `[tokens, layers, width]`; none for no samples.
fn packed_rows<'py>(
    py: Python<'py>,
    what: &'static str,
    lists: RowLists<'_>,
    [layers, width]: [usize; 2],
    lengths: &[usize],
) -> PyResult<Option<Bound<'py, PyAny>>> {
    fn slices<'a, T: numpy::Element>(arrays: &'a [PyReadonlyArray3<'_, T>]) -> Vec<&'a [T]> {
        let contiguous = "pack's replay rows are made contiguous";
        arrays
            .iter()
            .map(|a| a.as_slice().expect(contiguous))
            .collect()
    }
    let row = layers * width;
    let empty = match &lists {
        RowLists::U8(l) => l.is_empty(),
        RowLists::U16(l) => l.is_empty(),
        RowLists::U32(l) => l.is_empty(),
        RowLists::I32(l) => l.is_empty(),
    };
    let column = match lists {
        RowLists::U8(l) => {
            let s = slices(&l);
            Column::U8(detached(py, || core::pack_rows(what, &s, row, lengths))?)
        }
        RowLists::U16(l) => {
            let s = slices(&l);
            Column::U16(detached(py, || core::pack_rows(what, &s, row, lengths))?)
        }
        RowLists::U32(l) => {
            let s = slices(&l);
            Column::U32(detached(py, || core::pack_rows(what, &s, row, lengths))?)
        }
        RowLists::I32(l) => {
            let s = slices(&l);
            Column::I32(detached(py, || core::pack_rows(what, &s, row, lengths))?)
        }
    };
    if empty {
        return Ok(None);
    }
    let total = lengths.iter().sum();
    Ok(Some(column_array(py, column, [total, layers, width])?))
}
