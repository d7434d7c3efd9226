"""Replay tapes in the turn store and in packed batches: the Rust core against the reference.

A tape keeps each position's row once, in the turn that first fed it forward, in the smallest
integer type that holds the expert count; a turn reads its earlier positions from its parents.
Random turn trees with random replay inputs (rows asked from the right start, from another,
gaps of every reason) go into both stores and must read back byte for byte alike, and alike to
a position-by-position model of the rule; bad input raises the same error on both.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokentrail import _core
from tokentrail.core import reference
from tokentrail.core.backend import load_backend
from tokentrail.errors import PackError, PolicyError, ReplayError

BACKENDS = (_core, reference)
GAPS = _core.REPLAY_STATUS[2:]
PRESENT, FINAL, NOT_REQUESTED, _, _, RERENDERED, _ = range(7)

# Named tokens: system S, users U1 U2, assistant outputs A1 A2 (turn 0) and B1 (turn 1).
S, U1, U2 = 100, 201, 202
A1, A2, B1 = 301, 302, 311

# One layer, top-2 of 6 experts: a row is a pair.
SHAPE = (1, 2, 6)
token = st.integers(0, 9)


def rows_for(start: int, total: int, seed: int) -> np.ndarray:
    """Rows for positions `start..total-1` (the last token has none), distinct per seed."""
    positions = np.arange(start, max(start, total - 1))
    first = (positions + seed) % 6
    return np.stack([first, (first + 1) % 6], axis=-1)[:, None, :].astype(np.int32)


@st.composite
def replayed_sessions(draw: st.DrawFn) -> list[tuple[int, list[int], list[int], str]]:
    """A random tree of turns, each with how its replay input is made: "asked" (rows from the
    start the store says to ask), "early"/"late" (another start), a gap reason, or "none"."""
    turns: list[tuple[int, list[int], list[int], str]] = []
    full: list[list[int]] = []
    for t in range(draw(st.integers(1, 9))):
        parent = draw(st.sampled_from([-1, *range(t), *([t - 1] * 3 if t else [])]))
        prompt = (full[parent] if parent >= 0 else []) + draw(st.lists(token, max_size=5))
        edit = draw(st.sampled_from(["none", "none", "drift", "cut"]))
        if edit == "drift" and prompt:
            prompt[draw(st.integers(0, len(prompt) - 1))] = draw(token)
        elif edit == "cut" and prompt:
            prompt = prompt[: draw(st.integers(0, len(prompt)))]
        output = draw(st.lists(token, max_size=4))
        how = draw(st.sampled_from(["asked", "asked", "asked", "early", "late", "none", *GAPS]))
        turns.append((parent, prompt, output, how))
        full.append(prompt + output)
    return turns


def replay_arg(store, t: int, parent: int, prompt: list[int], output: list[int], how: str):
    asked = store.replay_start(parent, prompt)
    total = len(prompt) + len(output)
    if how == "none":
        return None
    if how in GAPS:
        return how
    start = {"asked": asked, "early": 0, "late": len(prompt)}[how]
    return start, rows_for(start, total, t)


def filled(backend, turns):
    store = backend.TurnStore(routed_experts=SHAPE)
    pushed = []
    for t, (parent, prompt, output, how) in enumerate(turns):
        arg = replay_arg(store, t, parent, prompt, output, how)
        assert store.push(parent, prompt, output, routed_experts=arg) == t
        pushed.append(arg)
    return store, pushed


def expected(turns, pushed, t: int, i: int) -> tuple[list[int], int]:
    """Position `i` of turn `t`, position by position: its origin turn's row, or why none."""
    parent, prompt, output, _ = turns[t]
    if i == len(prompt) + len(output) - 1:
        return [0, 0], FINAL
    if parent >= 0:
        pp, po = turns[parent][1], turns[parent][2]
        held = pp + po
        shared = 0
        while shared < min(len(held), len(prompt)) and held[shared] == prompt[shared]:
            shared += 1
        if i < min(shared, len(held) - 1):
            return expected(turns, pushed, parent, i)
    arg = pushed[t]
    if arg is None:
        return [0, 0], NOT_REQUESTED
    if isinstance(arg, str):
        return [0, 0], _core.REPLAY_STATUS.index(arg)
    start, rows = arg
    if i < start:
        return [0, 0], RERENDERED
    return rows[i - start, 0].tolist(), PRESENT


@given(turns=replayed_sessions(), data=st.data())
def test_both_stores_replay_every_position_from_its_origin(turns, data) -> None:
    (rust, pushed), (py, _) = filled(_core, turns), filled(reference, turns)
    assert rust.nbytes() == py.nbytes()
    for t, (_, prompt, output, _) in enumerate(turns):
        total = len(prompt) + len(output)
        length = data.draw(st.integers(0, total))
        got = [store.routed_experts(t, length) for store in (rust, py)]
        (rows, status), (py_rows, py_status) = got
        assert rows.dtype == py_rows.dtype == np.uint8 and rows.shape == (length, 1, 2)
        assert rows.tobytes() == py_rows.tobytes() and status.tobytes() == py_status.tobytes()
        for i in range(length):
            want_row, want_status = expected(turns, pushed, t, i)
            assert (rows[i, 0].tolist(), int(status[i])) == (want_row, want_status), (t, i)
        full_rows, _ = rust.routed_experts(t)
        assert len(full_rows) == total


def test_a_continued_prompt_asks_only_for_what_no_earlier_turn_fed_forward(backend) -> None:
    store = load_backend(backend).TurnStore(routed_experts=SHAPE)
    assert store.replay_start(-1, [S, U1]) == 0
    store.push(-1, [S, U1], [A1, A2], routed_experts=(0, rows_for(0, 4, 0)))
    # Turn 0 fed S U1 A1 forward; A2 it sampled but never fed: turn 1 computes it.
    assert store.replay_start(0, [S, U1, A1, A2, U2]) == 3
    # A prompt re-rendering A1 shares only S U1.
    assert store.replay_start(0, [S, U1, B1, U2]) == 2
    store.push(0, [S, U1, A1, A2, U2], [B1], routed_experts=(3, rows_for(3, 6, 1)))
    rows, status = store.routed_experts(1)
    assert rows[:, 0].tolist() == [
        *rows_for(0, 4, 0)[:, 0].tolist(),
        *rows_for(3, 6, 1)[:, 0].tolist(),
        [0, 0],
    ]
    assert status.tolist() == [PRESENT] * 5 + [FINAL]
    # Tails S U1 | U2, outputs A1 A2 | B1, and 5 rows of two bytes: nothing held twice.
    assert store.nbytes() == 4 * (3 + 3) + 8 * 2 + 5 * 2
    with pytest.raises(PolicyError, match="parent turn 2 does not exist"):
        store.replay_start(2, [S])


@pytest.mark.parametrize(
    ("experts", "dtype"),
    [(2, np.uint8), (256, np.uint8), (257, np.uint16), (65536, np.uint16), (65537, np.uint32)],
)
def test_rows_are_kept_in_the_smallest_type_that_holds_the_expert_count(experts, dtype) -> None:
    for core in BACKENDS:
        store = core.TurnStore(routed_experts=(2, 1, experts))
        rows = np.full((2, 2, 1), experts - 1, dtype=np.int32)
        store.push(-1, [S, U1], [A1], routed_experts=(0, rows))
        got, _ = store.routed_experts(0)
        assert got.dtype == dtype and got[:2].tolist() == rows.tolist()
        assert store.nbytes() == 4 * 3 + 8 + 4 * np.dtype(dtype).itemsize
        assert store.routed_experts_shape == (2, 1, experts)


def test_the_indexer_tape_keeps_int32_and_its_empty_slots() -> None:
    for core in BACKENDS:
        store = core.TurnStore(indexer_topk=(2, 3))
        rows = np.array([[[-1, -1, -1], [-1, -1, -1]], [[0, -1, -1], [0, -1, -1]]])
        store.push(-1, [S, U1], [A1], indexer_topk=(0, rows))
        got, status = store.indexer_topk(0)
        assert got.dtype == np.int32 and got[:2].tolist() == rows.tolist()
        assert status.tolist() == [PRESENT, PRESENT, FINAL]
        assert store.indexer_topk_shape == (2, 3) and store.routed_experts_shape is None


def test_rust_hands_its_rows_to_numpy_without_copying() -> None:
    store = _core.TurnStore(routed_experts=SHAPE)
    store.push(-1, [S, U1], [A1], routed_experts=(0, rows_for(0, 3, 0)))
    rows, status = store.routed_experts(0)
    assert not rows.flags.owndata and type(rows.base.base).__name__ == "PySliceContainer"
    assert type(status.base).__name__ == "PySliceContainer"


TWO_ROWS = np.zeros((2, 1, 2), dtype=np.int32)
KNOWN = f"({', '.join(repr(gap) for gap in GAPS)})"

# (store kwargs, push kwargs, error, message)
BAD_REPLAY = [
    ({}, {"routed_experts": (0, TWO_ROWS)}, ReplayError,
     "routed_experts: given, but the store was made without a routed_experts shape"),
    ({"routed_experts": SHAPE}, {"indexer_topk": "not_supported"}, ReplayError,
     "indexer_topk: given, but the store was made without a indexer_topk shape"),
    ({"routed_experts": SHAPE}, {"routed_experts": "late"}, ReplayError,
     f"routed_experts: unknown reason 'late'; expected one of {KNOWN}"),
    ({"routed_experts": SHAPE}, {"routed_experts": [0, TWO_ROWS]}, ReplayError,
     "routed_experts: expected None, a reason or (start, rows), got list"),
    ({"routed_experts": SHAPE}, {"routed_experts": (-1, TWO_ROWS)}, ReplayError,
     "routed_experts: start -1 is outside [0, 2], the prompt"),
    ({"routed_experts": SHAPE}, {"routed_experts": (3, TWO_ROWS)}, ReplayError,
     "routed_experts: start 3 is outside [0, 2], the prompt"),
    ({"routed_experts": SHAPE}, {"routed_experts": (0, np.zeros((2, 2), np.int32))}, ReplayError,
     "routed_experts: rows must be a 3-D integer array, got int32(2, 2)"),
    ({"routed_experts": SHAPE}, {"routed_experts": (0, np.zeros((2, 1, 2)))}, ReplayError,
     "routed_experts: rows must be a 3-D integer array, got float64(2, 1, 2)"),
    ({"routed_experts": SHAPE}, {"routed_experts": (0, np.zeros((2, 2, 2), np.uint8))},
     ReplayError, "routed_experts: rows of shape (2, 2, 2) for a store of 1 layers x 2"),
    ({"routed_experts": SHAPE}, {"routed_experts": (1, TWO_ROWS)}, ReplayError,
     "routed_experts: 2 rows from position 1; a turn of 2 + 1 tokens has 1 there"),
    ({"routed_experts": SHAPE}, {"routed_experts": (0, TWO_ROWS + [[[0, 6]]])}, ReplayError,
     "routed_experts: value 6 at row 0 is outside [0, 5]"),
    ({"routed_experts": SHAPE}, {"routed_experts": (0, TWO_ROWS - 1)}, ReplayError,
     "routed_experts: value -1 at row 0 is outside [0, 5]"),
    ({"indexer_topk": (1, 2)}, {"indexer_topk": (0, TWO_ROWS - 2)}, ReplayError,
     "indexer_topk: value -2 at row 0 is outside [-1, 2147483647]"),
    # The replay argument's form comes before the logprobs, its fit after the parent.
    ({"routed_experts": SHAPE}, {"routed_experts": "late", "logprobs": [-1.0, -2.0]},
     ReplayError, f"routed_experts: unknown reason 'late'; expected one of {KNOWN}"),
    ({"routed_experts": SHAPE}, {"routed_experts": (9, TWO_ROWS), "parent": 4}, PolicyError,
     "parent turn 4 does not exist (0 turns stored)"),
]  # fmt: skip


@pytest.mark.parametrize(("store_kwargs", "push_kwargs", "error", "message"), BAD_REPLAY)
def test_bad_replay_input_raises_the_same_named_error_on_both(
    store_kwargs, push_kwargs, error, message
) -> None:
    for core in BACKENDS:
        store = core.TurnStore(**store_kwargs)
        kwargs = dict(push_kwargs)
        parent, logprobs = kwargs.pop("parent", -1), kwargs.pop("logprobs", None)
        with pytest.raises(ValueError) as caught:
            store.push(parent, [S, U1], [A1], logprobs, **kwargs)
        assert (type(caught.value), str(caught.value)) == (error, message), core.__name__
        assert len(store) == 0 and store.nbytes() == 0, "a refused push stores nothing"


@pytest.mark.parametrize(
    ("read", "message"),
    [
        (lambda s: s.routed_experts(0, 4), "routed_experts: length 4 is past turn 0's 3 tokens"),
        (lambda s: s.indexer_topk(0),
         "indexer_topk: the store was made without a indexer_topk shape"),
    ],
)  # fmt: skip
def test_reads_past_a_turn_or_of_an_unkept_tape_are_refused(read, message) -> None:
    for core in BACKENDS:
        store = core.TurnStore(routed_experts=SHAPE)
        store.push(-1, [S, U1], [A1], routed_experts="engine_returned_none")
        with pytest.raises(ReplayError) as caught:
            read(store)
        assert str(caught.value) == message
        _, status = store.routed_experts(0)
        assert [_core.REPLAY_STATUS[c] for c in status] == [
            "engine_returned_none",
            "engine_returned_none",
            "final_token",
        ]


@pytest.mark.parametrize(
    "shape",
    [(0, 8, 128), (48, 0, 128), (48, 8, 0), (48, 8, 2**32)],
)
def test_a_store_needs_a_real_shape(shape) -> None:
    messages = set()
    for core in BACKENDS:
        with pytest.raises(ReplayError) as caught:
            core.TurnStore(routed_experts=shape)
        messages.add(str(caught.value))
    assert messages == {
        "routed_experts: layers, top_k and num_experts must lie in [1, 2**32), got "
        f"({shape[0]}, {shape[1]}, {shape[2]})"
    }


# --- packing ---------------------------------------------------------------------------------


@st.composite
def packed_with_rows(draw: st.DrawFn) -> tuple:
    n = draw(st.integers(0, 5))
    dtype = draw(st.sampled_from([np.uint8, np.uint16, np.uint32, np.int32]))
    tokens, masks, logprobs, lengths, rows = [], [], [], [], []
    for _ in range(n):
        ids = draw(st.lists(token, max_size=8))
        length = draw(st.integers(0, len(ids)))
        tokens.append(ids)
        masks.append([1] * length)
        logprobs.append([-0.5] * length)
        lengths.append(length)
        values = draw(st.lists(st.integers(0, 200), min_size=6 * len(ids), max_size=6 * len(ids)))
        rows.append(np.array(values, dtype=dtype).reshape(len(ids), 2, 3))
    return tokens, masks, logprobs, lengths, [0.0] * n, rows


@given(packed_with_rows())
def test_rust_packs_replay_rows_as_the_reference_does(args) -> None:
    *plain, rows = args
    rust = _core.pack(*plain, routed_experts=rows, indexer_topk=rows)
    ref = reference.pack(*plain, routed_experts=rows, indexer_topk=rows)
    for got in (rust.routed_experts, rust.indexer_topk):
        want = ref.routed_experts
        if want is None:
            assert got is None and not rows
            continue
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
        assert got.shape == (len(rust.tokens), 2, 3)


ROW = np.zeros((1, 2, 3), dtype=np.uint8)
EXPECTED = "expected a 3-D array of uint8, uint16, uint32 or int32"
BAD_PACKS = [
    ([ROW, ROW], "routed_experts: 2 entries for 1 samples"),
    ([np.zeros((2, 2, 3), np.uint8)], "sample 0: 2 routed_experts rows for 1 tokens"),
    ([ROW.astype(np.int64)],
     f"routed_experts[0]: {EXPECTED}, got int64(1, 2, 3)"),
    ([np.zeros((1, 6), np.uint8)],
     f"routed_experts[0]: {EXPECTED}, got uint8(1, 6)"),
    ([ROW, np.zeros((0, 3, 2), np.uint8)],
     "routed_experts[1]: rows of (3, 2) uint8, but routed_experts[0] has (2, 3) uint8"),
    ([ROW, np.zeros((0, 2, 3), np.uint16)],
     "routed_experts[1]: rows of (2, 3) uint16, but routed_experts[0] has (2, 3) uint8"),
]  # fmt: skip


@pytest.mark.parametrize(("rows", "message"), BAD_PACKS)
def test_replay_rows_that_do_not_fit_are_refused_alike(rows, message) -> None:
    for core in BACKENDS:
        with pytest.raises(PackError) as caught:
            core.pack([[S]], [[]], [[]], [0], [0.0], routed_experts=rows)
        assert str(caught.value) == message, core.__name__
