"""The sliced base64 decode of replay rows (`engines.wire_rows`) against the plain one:
`np.frombuffer(base64.b64decode(...))` for SGLang's int32 rows, `np.load` for vLLM's `.npy`,
on generated rows of every store type, with slices small enough that every boundary falls
somewhere, and on damaged input."""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentrail.engines.wire_rows import decode_int32_base64, decode_npy_base64

STORE_TYPES = [np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.int32)]
INT32 = st.integers(-(2**31), 2**31 - 1)


def plain_int32(text: str, dtype: np.dtype) -> np.ndarray | None:
    """The slow path: decode it all, then narrow what fits; None for what does not."""
    try:
        values = np.frombuffer(base64.b64decode(text, validate=True), dtype="<i4")
    except (binascii.Error, ValueError):
        return None
    info = np.iinfo(dtype)
    if values.size and (values.min() < info.min or values.max() > info.max):
        return None
    return values.astype(dtype)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.one_of(st.integers(0, 300), INT32), max_size=64),
    dtype=st.sampled_from(STORE_TYPES),
    chunk=st.sampled_from([16, 32, 48, 4096]),
)
def test_sliced_int32_decode_equals_the_plain_one(values, dtype, chunk) -> None:
    text = base64.b64encode(np.asarray(values, dtype="<i4").tobytes()).decode()
    fast, slow = decode_int32_base64(text, dtype, chunk), plain_int32(text, dtype)
    if slow is None:
        assert isinstance(fast, str)
    else:
        assert isinstance(fast, np.ndarray) and fast.dtype == dtype
        assert np.array_equal(fast, slow)


@pytest.mark.parametrize(
    "text",
    ["AAA", "AAAA====", "AA==AAAA", "AAAAAAA=", "A-AA", "AAAA\nAAAA", "ÀAAA"],
)
def test_damaged_int32_base64_is_named(text: str) -> None:
    for chunk in (16, 4096):
        assert isinstance(decode_int32_base64(text, np.dtype(np.uint8), chunk), str)


@settings(max_examples=100, deadline=None)
@given(
    rows=st.integers(0, 9),
    stored=st.sampled_from([np.uint8, np.uint16, np.int32, np.int64]),
    want=st.sampled_from(STORE_TYPES),
    seed=st.integers(0, 2**16),
    fortran=st.booleans(),
)
def test_npy_decode_equals_np_load(rows, stored, want, seed, fortran) -> None:
    top = min(int(np.iinfo(stored).max), 400)
    array = np.random.default_rng(seed).integers(0, top + 1, (rows, 3, 2)).astype(stored)
    if fortran:
        array = np.asfortranarray(array)
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    text = base64.b64encode(buffer.getvalue()).decode()
    slow = np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False)
    fast = decode_npy_base64(text, want)
    if slow.size and slow.max() > np.iinfo(want).max:
        assert isinstance(fast, str)
    else:
        assert isinstance(fast, np.ndarray) and fast.dtype == want
        assert np.array_equal(fast, slow)


def test_a_npy_that_is_not_of_integers_or_cut_short_is_named() -> None:
    for array in (np.zeros((2, 3, 2), np.float32), np.zeros((2, 3, 2), np.uint8)):
        buffer = io.BytesIO()
        np.save(buffer, array)
        data = buffer.getvalue()
        if array.dtype.kind == "u":
            data = data[:-1]
        assert isinstance(decode_npy_base64(base64.b64encode(data).decode(), np.uint8), str)
    assert isinstance(decode_npy_base64("bm90IGEgbnB5", np.uint8), str)
