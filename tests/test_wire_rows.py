"""The fast paths of replay rows off the wire (`engines.wire_rows`) against the plain ones:
the sliced decode against `np.frombuffer(base64.b64decode(...))` for SGLang's int32 rows and
`np.load` for vLLM's `.npy`, on generated rows of every store type, with slices small enough
that every boundary falls somewhere, and on damaged input; lifting the base64 out of an answer
before parsing it against `json.loads` of the whole answer."""

from __future__ import annotations

import base64
import binascii
import io
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentrail.engines.wire_rows import decode_int32_base64, decode_npy_base64, lift_base64

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


def _resolve(value: object, lifted: dict) -> object:
    """The parsed answer with every placeholder replaced by the text it stands for."""
    if isinstance(value, dict):
        return {k: _resolve(v, lifted) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, lifted) for v in value]
    if isinstance(value, str) and value in lifted:
        return bytes(lifted[value]).decode("utf-8")
    return value


TEXTS = st.one_of(
    st.text(max_size=12),
    st.sampled_from(['"routed_experts":"AAAA"', '\\"indexer_topk\\": "', "\\", '"', "=="]),
)
B64 = st.binary(max_size=24).map(lambda b: base64.b64encode(b).decode())


@settings(max_examples=300, deadline=None)
@given(
    routed=st.one_of(B64, TEXTS),
    indexer=st.one_of(st.none(), B64),
    text=TEXTS,
    spaced=st.booleans(),
    ascii_only=st.booleans(),
    escape_slash=st.booleans(),
)
def test_lifting_the_base64_then_parsing_equals_parsing_it_all(
    routed, indexer, text, spaced, ascii_only, escape_slash
) -> None:
    meta: dict = {"text": text, "routed_experts": routed, "note": {"routed_experts": text}}
    if indexer is not None:
        meta["indexer_topk"] = indexer
    answer = {"text": text, "meta_info": meta, "output_ids": [1, 2]}
    separators = (", ", ": ") if spaced else (",", ":")
    raw = json.dumps(answer, separators=separators, ensure_ascii=ascii_only)
    if escape_slash:
        raw = raw.replace("/", "\\/")  # some encoders escape it; such a value is not lifted
    skeleton, lifted = lift_base64(raw.encode())
    assert _resolve(json.loads(skeleton), lifted) == json.loads(raw)


def test_a_lifted_value_is_a_view_of_the_answer_and_decodes_in_place() -> None:
    rows = np.arange(48 * 8 * 3, dtype="<i4") % 128
    raw = json.dumps({"meta_info": {"routed_experts": base64.b64encode(rows.tobytes()).decode()}})
    skeleton, lifted = lift_base64(bytearray(raw.encode()))
    (placeholder,) = lifted
    assert json.loads(skeleton)["meta_info"]["routed_experts"] == placeholder
    assert isinstance(lifted[placeholder], memoryview)
    decoded = decode_int32_base64(lifted[placeholder], np.dtype(np.uint8), 16)
    assert np.array_equal(decoded, rows)
