"""The reference of packing (`rust/pack.rs`): samples flattened into one varlen-attention
batch, with their replay rows when given."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from tokentrail.core.ids import Logprobs, RowArray, TokenArray, TokenIds
from tokentrail.core.packed import PackedBatch
from tokentrail.core.reference.linearize import token_list
from tokentrail.errors import PackError

# The core's `Packed` has the fields of this one batch type, which the reference returns as is.
Packed = PackedBatch


_INT32_MAX = 2**31 - 1

_Ints = Sequence[int] | npt.NDArray[np.integer]
_Floats = Sequence[float] | npt.NDArray[np.floating]
_Scalar = TypeVar("_Scalar", bound=np.generic)


def pack(
    tokens: Sequence[TokenIds],
    loss_masks: Sequence[_Ints],
    logprobs: Sequence[Logprobs],
    response_lengths: _Ints,
    rewards: _Floats,
    routed_experts: Sequence[RowArray] | None = None,
    indexer_topk: Sequence[RowArray] | None = None,
) -> PackedBatch:
    """Pack samples into one batch for variable-length attention.

    Sample `i` is `tokens[i]` (prompt and response); its last `response_lengths[i]` tokens carry
    `loss_masks[i]` and `logprobs[i]`. Per token: the tokens (uint32), `position_ids` restarting
    at 0 in each sample and `sample_index` (int32), the loss mask (uint8) and logprobs (float32),
    both 0 on prompt positions. Per sample: `rewards` and zero `advantages` (float32).
    `cu_seqlens` (int32) is 0 then the running lengths.

    Masks, logprobs, lengths and rewards are read as `np.asarray` reads them, then the tokens
    (as `token_list` checks them). Then, in order: every per-sample input has one entry per
    token array; sample by sample, `0 <= response_length <= len(tokens)` and the mask, then the
    logprobs, have `response_length` entries; the packed length and the sample count fit int32.

    `routed_experts` and `indexer_topk`, when given, hold one 3-D array per sample, a row per
    token, all of one element type (uint8, uint16, uint32 or int32) and row shape; each is
    checked as it is read (after the tokens), its count and rows after everything above, and
    packed into `[tokens, layers, width]`.
    """
    masks = [_array1(mask, np.uint8) for mask in loss_masks]
    lps = [_array1(lp, np.float32) for lp in logprobs]
    lengths = _array1(response_lengths, np.int64)
    reward_array = _array1(rewards, np.float32)
    ids = [_packed_ids(t, f"tokens[{i}]") for i, t in enumerate(tokens)]
    replay = {
        what: _row_arrays(values, what)
        for what, values in (("routed_experts", routed_experts), ("indexer_topk", indexer_topk))
        if values is not None
    }

    n = len(ids)
    counts = (
        ("loss_masks", len(masks)),
        ("logprobs", len(lps)),
        ("response_lengths", len(lengths)),
        ("rewards", len(reward_array)),
    )
    for what, got in counts:
        if got != n:
            raise PackError(f"{what}: {got} entries for {n} samples")
    for i, (t, mask, lp, length) in enumerate(zip(ids, masks, lps, lengths.tolist(), strict=True)):
        if not 0 <= length <= len(t):
            raise PackError(
                f"sample {i}: response_length {length} is outside [0, {len(t)}], its token count"
            )
        for what, got in (("loss_mask", len(mask)), ("logprobs", len(lp))):
            if got != length:
                raise PackError(f"sample {i}: {got} {what} entries for response_length {length}")
    seqlens = [len(t) for t in ids]
    total = sum(seqlens)
    if total > _INT32_MAX or n > _INT32_MAX:
        raise PackError(f"{n} samples of {total} tokens in all do not fit int32 cu_seqlens")
    packed_rows = {what: _packed_rows(arrays, what, seqlens) for what, arrays in replay.items()}

    mask_parts: list[npt.NDArray[np.uint8]] = []
    lp_parts: list[npt.NDArray[np.float32]] = []
    for t, mask, lp, length in zip(ids, masks, lps, lengths.tolist(), strict=True):
        prompt = len(t) - length
        mask_parts += [np.zeros(prompt, dtype=np.uint8), mask]
        lp_parts += [np.zeros(prompt, dtype=np.float32), lp]
    cu_seqlens = np.zeros(n + 1, dtype=np.int32)
    cu_seqlens[1:] = np.cumsum(seqlens, dtype=np.int64)
    return PackedBatch(
        tokens=_concat(ids, np.uint32),
        cu_seqlens=cu_seqlens,
        position_ids=_concat([np.arange(k, dtype=np.int32) for k in seqlens], np.int32),
        sample_index=_concat(
            [np.full(k, i, dtype=np.int32) for i, k in enumerate(seqlens)], np.int32
        ),
        loss_mask=_concat(mask_parts, np.uint8),
        logprobs=_concat(lp_parts, np.float32),
        rewards=reward_array.copy(),
        advantages=np.zeros(n, dtype=np.float32),
        max_seqlen=max(seqlens, default=0),
        routed_experts=packed_rows.get("routed_experts"),
        indexer_topk=packed_rows.get("indexer_topk"),
    )


_ROW_TYPES = ("uint8", "uint16", "uint32", "int32")


def _row_arrays(values: Sequence[object], what: str) -> list[RowArray]:
    """Per-sample replay rows: 3-D arrays of one tape type and row shape, as the first one."""
    arrays = [np.ascontiguousarray(value) for value in values]
    for i, array in enumerate(arrays):
        if array.ndim != 3 or str(array.dtype) not in _ROW_TYPES or 0 in array.shape[1:]:
            raise PackError(
                f"{what}[{i}]: expected a 3-D array of uint8, uint16, uint32 or int32, "
                f"got {array.dtype}{array.shape}"
            )
        first = arrays[0]
        if (array.dtype, array.shape[1:]) != (first.dtype, first.shape[1:]):
            (layers, k), (layers0, k0) = array.shape[1:], first.shape[1:]
            raise PackError(
                f"{what}[{i}]: rows of ({layers}, {k}) {array.dtype}, but {what}[0] has "
                f"({layers0}, {k0}) {first.dtype}"
            )
    return arrays


def _packed_rows(arrays: list[RowArray], what: str, seqlens: list[int]) -> RowArray | None:
    """The samples' rows one after another, or None for no samples."""
    if len(arrays) != len(seqlens):
        raise PackError(f"{what}: {len(arrays)} entries for {len(seqlens)} samples")
    for i, (array, tokens) in enumerate(zip(arrays, seqlens, strict=True)):
        if len(array) != tokens:
            raise PackError(f"sample {i}: {len(array)} {what} rows for {tokens} tokens")
    return np.concatenate(arrays) if arrays else None


def _array1(values: object, dtype: type[_Scalar]) -> npt.NDArray[_Scalar]:
    """`values` as numpy's `asarray` reads them, which must be 1-D."""
    array = np.asarray(values, dtype=dtype)
    if array.ndim != 1:
        raise TypeError(f"expected a 1-D array of {np.dtype(dtype)}, got {array.ndim} dimensions")
    return array


def _packed_ids(ids: object, what: str) -> TokenArray:
    """A 1-D uint32 array as it is; anything else checked by `token_list`."""
    if isinstance(ids, np.ndarray) and ids.ndim == 1 and ids.dtype == np.uint32:
        return ids
    return np.asarray(token_list(ids, what), dtype=np.uint32)


def _concat(parts: Sequence[npt.NDArray[np.generic]], dtype: type[_Scalar]) -> npt.NDArray[_Scalar]:
    if not parts:
        return np.zeros(0, dtype=dtype)
    return np.concatenate(parts).astype(dtype, copy=False)
