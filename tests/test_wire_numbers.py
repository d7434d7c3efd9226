"""An engine's long arrays of numbers read by the Rust core (`_core.number_array`, the GIL let
go) exactly as the reference and `json.loads` read them; and the C-level checks of a turn's ids
and logprobs (`only_types`) deciding as the per-token checks they skip.

Generated texts: arrays of scalars and of rows (ints near the 64-bit edge, floats in every
notation, `true`, `false`, `null`, JSON whitespace), and the same broken a byte at a time.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokentrail import _core
from tokentrail.core import reference
from tokentrail.core.backend import load_backend
from tokentrail.core.ids import as_token_array
from tokentrail.engines import wire_json
from tokentrail.engines.base import Generation
from tokentrail.engines.sglang import _entries
from tokentrail.engines.validation import check_generation
from tokentrail.errors import EngineError, EngineOutputError, TokenIdError

SPACE = st.sampled_from(["", "", " ", "\n", "\t ", "\r\n"])
INT64 = 2**63


def float_text(x: float, style: int) -> str:
    if style == 0:
        return repr(x)
    if style == 1:
        return f"{x:.17e}"
    return f"{x:.3E}".replace("E+0", "E+").replace("E-0", "e-")


@st.composite
def scalar_texts(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["int", "int", "edge", "float", "float", "word"]))
    if kind == "int":
        return str(draw(st.integers(-(10**6), 10**6)))
    if kind == "edge":
        return str(draw(st.sampled_from([-INT64 - 1, -INT64, INT64 - 1, INT64, 10**30, -0])))
    if kind == "float":
        x = draw(st.floats(allow_nan=False, allow_infinity=False))
        return float_text(x, draw(st.integers(0, 2)))
    return draw(st.sampled_from(["true", "false", "null"]))


@st.composite
def array_texts(draw: st.DrawFn) -> str:
    """The text between an array's brackets: scalars, or rows (mostly of one width)."""
    n = draw(st.integers(0, 12))
    if draw(st.booleans()):
        items = [draw(scalar_texts()) for _ in range(n)]
    else:
        width = draw(st.integers(1, 4))
        items = []
        for _ in range(n):
            w = width if draw(st.integers(0, 9)) else draw(st.integers(0, 5))
            cells = [draw(SPACE) + draw(scalar_texts()) + draw(SPACE) for _ in range(w)]
            items.append("[" + ",".join(cells) + "]")
    return ",".join(draw(SPACE) + item + draw(SPACE) for item in items)


@st.composite
def broken(draw: st.DrawFn) -> bytes:
    text = draw(array_texts()).encode()
    if not text:
        return text
    at = draw(st.integers(0, len(text)))
    junk = draw(st.sampled_from([b"", b",", b"[", b"]", b"-", b".", b"e", b"0", b'"', b"NaN"]))
    cut = draw(st.integers(0, 2))
    return text[:at] + junk + text[at + cut :]


def same(a: object, b: object) -> bool:
    """Equal, with each value's type (1 is not 1.0 is not True) and -0.0 and NaN told apart."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and repr(a) == repr(b))
    return type(a) is type(b) and a == b


@given(st.one_of(array_texts().map(str.encode), broken()))
def test_the_core_reads_a_number_array_as_the_reference_does(text: bytes) -> None:
    assert same(_core.number_array(text), reference.number_array(text))


@given(array_texts())
def test_what_the_core_reads_is_what_json_loads_reads(text: str) -> None:
    got = _core.number_array(text.encode())
    if got is None:
        return
    width, values, types = got
    parsed = json.loads(f"[{text}]")
    expected = [v for row in parsed for v in row] if width else parsed
    assert same(values, expected)
    assert all(len(row) == width for row in parsed) if width else True
    step = max(width, 1)
    for k, kind in enumerate(types):
        column = {type(v) for v in values[k::step]}
        assert kind is (column.pop() if len(column) == 1 else None)
    assert len(types) == min(step, len(values))


@given(st.lists(array_texts(), min_size=1, max_size=3), st.integers(8, 64))
def test_an_answer_read_in_pieces_is_what_json_loads_reads(texts: list[str], piece: int) -> None:
    raw = "{" + ",".join(f'"k{i}": [{t}]' for i, t in enumerate(texts)) + ', "s": "x"}'
    expected = json.loads(raw)
    got = wire_json.loads_in_pieces(raw.encode(), piece_bytes=piece)
    assert got == expected
    for key, value in expected.items():
        assert same(list(got[key]) if isinstance(got[key], wire_json.Rows) else got[key], value)


def test_a_long_answer_s_entries_come_back_as_rows_from_the_core(monkeypatch) -> None:
    called = []
    monkeypatch.setattr(load_backend(), "number_array", lambda t: called.append(1) or None)
    entries = ",".join(f"[-0.{k % 9}, {k}, null]" for k in range(5000))
    raw = f'{{"meta_info": {{"output_token_logprobs": [{entries}]}}}}'.encode()
    slow = wire_json.loads_in_pieces(raw, piece_bytes=1024)
    assert called  # the core was asked, and its None sent the array to the Python pieces
    monkeypatch.undo()
    fast = wire_json.loads_in_pieces(raw, piece_bytes=1024)
    rows = fast["meta_info"]["output_token_logprobs"]
    assert isinstance(rows, wire_json.Rows) and rows.width == 3
    assert rows.types == [float, int, type(None)]
    assert slow["meta_info"]["output_token_logprobs"].types is None
    assert (
        rows
        == slow["meta_info"]["output_token_logprobs"]
        == json.loads(raw)["meta_info"]["output_token_logprobs"]
    )


# -- C-level checks of ids and logprobs ---------------------------------------------------------

ID_ITEMS = st.one_of(
    st.integers(0, 2**32 - 1),
    st.integers(-5, 2**33),
    st.sampled_from([True, False, -1, 2**32, 2**64, 1.0, "7", None, np.int64(3), np.uint32(4)]),
)


def outcome(fn, *args):
    try:
        result = fn(*args)
    except (TokenIdError, EngineError) as exc:
        return type(exc), str(exc)
    return result.tolist() if isinstance(result, np.ndarray) else result


def slow_token_array(ids: object, what: str) -> object:
    """`as_token_array` before its C-level check: the per-token loop alone."""
    for pos, x in enumerate(ids):  # type: ignore[arg-type]
        if isinstance(x, bool) or not isinstance(x, int | np.integer):
            raise TokenIdError(f"{what}[{pos}]: expected an int, got {type(x).__name__}")
        if x < 0 or x > 2**32 - 1:
            raise TokenIdError(f"{what}[{pos}]: id {x} is outside [0, 2**32)")
    return np.asarray(ids, dtype=np.uint32)


@given(st.lists(st.one_of(st.integers(0, 2**32 - 1), ID_ITEMS), max_size=20))
def test_token_ids_are_checked_as_the_per_token_loop_checks_them(ids: list) -> None:
    assert outcome(as_token_array, ids, "ids") == outcome(slow_token_array, ids, "ids")
    assert outcome(as_token_array, tuple(ids), "ids") == outcome(slow_token_array, ids, "ids")


ENTRY = st.one_of(
    st.tuples(st.floats(-30, 0), st.integers(0, 1000), st.none()).map(list),
    st.tuples(
        st.sampled_from([-1, 0, True, -0.5, "x", None]),
        st.sampled_from([3, True, 2.0, "4", None]),
        st.none(),
    ).map(list),
)


@given(st.lists(ENTRY, max_size=12))
def test_sglang_entries_read_flat_as_they_read_one_by_one(entries: list) -> None:
    values = [v for e in entries for v in e]
    # A plain list takes `_entries`' per-entry loop, the slow path the flat reads are held to.
    expected = outcome(_entries, entries)
    kinds = [{type(v) for v in values[k::3]} for k in range(3 if values else 0)]
    types = [k.pop() if len(k) == 1 else None for k in kinds]
    for rows in (wire_json.Rows(3, values), wire_json.Rows(3, values, types)):
        got = outcome(_entries, rows)
        assert same(got, expected) if isinstance(got, tuple) else got == expected


@given(
    st.lists(st.one_of(st.integers(0, 99), ID_ITEMS), min_size=1, max_size=8),
    st.lists(
        st.one_of(st.floats(-9, 0), st.sampled_from([0, -1, True, 0.5, "x", float("nan")])),
        min_size=8,
        max_size=8,
    ),
)
def test_a_generation_is_checked_as_the_per_token_checks_did(ids: list, lps: list) -> None:
    lps = lps[: len(ids)]
    generation = Generation(ids, lps, "stop", 1, 0.0)

    def check(g: Generation) -> str:
        try:
            check_generation(g, max_new_tokens=99, vocab_size=100, end_token_ids={99})
        except EngineOutputError as exc:
            return f"{exc.fault}: {exc}"
        return "ok"

    # The same turn with its ids and logprobs as numpy scalars: only the per-token path.
    mixed = Generation(
        [np.int64(t) if type(t) is int and -(2**63) <= t < 2**63 else t for t in ids],
        [np.float64(x) if type(x) is float else x for x in lps],
        "stop",
        1,
        0.0,
    )
    assert check(generation) == check(mixed)


@pytest.mark.parametrize("size", [0, 1, 70_000])
def test_a_long_array_of_ids_is_one_call_of_the_core(size: int) -> None:
    text = ",".join(str(k % 151_000) for k in range(size)).encode()
    types = [int] if size else []
    assert _core.number_array(text) == (0, [k % 151_000 for k in range(size)], types)
