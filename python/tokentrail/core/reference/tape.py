"""The reference of replay tapes (`rust/tape.rs`): per-token data an engine reports beyond ids
(routed experts, indexer top-k), kept per turn in the smallest integer type that holds it, each
turn keeping rows only for the positions it is the origin of."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokentrail.core.ids import MaskArray, RowArray
from tokentrail.errors import ReplayError

# What a materialized position holds; a status's code is its index.
REPLAY_STATUS = (
    "present",
    "final_token",
    "not_requested",
    "engine_returned_none",
    "shape_mismatch",
    "rerendered_prefix",
    "not_supported",
)
PRESENT, FINAL_TOKEN, NOT_REQUESTED, _, _, RERENDERED_PREFIX, _ = range(len(REPLAY_STATUS))
# The reasons a caller may give for a turn without rows.
GAPS = REPLAY_STATUS[2:]


@dataclass(frozen=True)
class TapeShape:
    """A tape's row shape and the range its values lie in."""

    layers: int
    width: int
    min: int
    max: int

    @classmethod
    def routing(cls, layers: int, top_k: int, num_experts: int) -> TapeShape:
        if not all(1 <= d < 2**32 for d in (layers, top_k, num_experts)):
            raise ReplayError(
                "routed_experts: layers, top_k and num_experts must lie in [1, 2**32), got "
                f"({layers}, {top_k}, {num_experts})"
            )
        return cls(layers, top_k, 0, num_experts - 1)

    @classmethod
    def indexer(cls, layers: int, top_k: int) -> TapeShape:
        if layers < 1 or top_k < 1:
            raise ReplayError(
                f"indexer_topk: layers and top_k must be >= 1, got ({layers}, {top_k})"
            )
        return cls(layers, top_k, -1, 2**31 - 1)

    @property
    def row(self) -> int:
        return self.layers * self.width

    @property
    def dtype(self) -> np.dtype:
        """The smallest element type that holds every value in range."""
        if self.min < 0:
            return np.dtype(np.int32)
        for dtype in (np.uint8, np.uint16):
            if self.max <= np.iinfo(dtype).max:
                return np.dtype(dtype)
        return np.dtype(np.uint32)


# One push argument, parsed: None (absent), a status code, or (start, rows).
Given = None | int | tuple[int, RowArray]


def read_rows(value: object, what: str) -> RowArray:
    """`value` as numpy reads it, which must be a 3-D integer array."""
    array = np.ascontiguousarray(value)
    if array.ndim != 3 or array.dtype.kind not in "iu":
        raise ReplayError(
            f"{what}: rows must be a 3-D integer array, got {array.dtype}{array.shape}"
        )
    if array.dtype == np.uint64 and array.size and int(array.max()) > 2**63 - 1:
        raise ReplayError(f"{what}: value {int(array.max())} does not fit int64")
    return array


def given(value: object, channel: str, prompt: int) -> Given:
    """What a push was given for `channel`: None, a reason, or `(start, rows)`."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in GAPS:
            known = ", ".join(f"'{gap}'" for gap in GAPS)
            raise ReplayError(f"{channel}: unknown reason {value!r}; expected one of ({known})")
        return REPLAY_STATUS.index(value)
    if isinstance(value, tuple) and len(value) == 2:
        start = int(value[0])
        if start < 0:
            raise ReplayError(f"{channel}: start {start} is outside [0, {prompt}], the prompt")
        return start, read_rows(value[1], channel)
    raise ReplayError(
        f"{channel}: expected None, a reason or (start, rows), got {type(value).__name__}"
    )


@dataclass
class _TapeTurn:
    start: int  # `from` in the core: the first own position with a row
    rows: RowArray
    status: int


class Tape:
    """One channel's rows for every turn of a store."""

    def __init__(self, channel: str, shape: TapeShape) -> None:
        self.channel = channel
        self.shape = shape
        self.turns: list[_TapeTurn] = []

    def nbytes(self) -> int:
        return sum(t.rows.nbytes for t in self.turns)

    def _refuse(self, problem: str) -> ReplayError:
        return ReplayError(f"{self.channel}: {problem}")

    def check(self, given: Given, prompt: int, output: int) -> None:
        """Refuse rows that do not fit a turn: the start, the row shape, the count, the values."""
        if not isinstance(given, tuple):
            return
        start, rows = given
        if start > prompt:
            raise self._refuse(f"start {start} is outside [0, {prompt}], the prompt")
        n, layers, width = rows.shape
        shape = self.shape
        if (layers, width) != (shape.layers, shape.width):
            raise self._refuse(
                f"rows of shape ({n}, {layers}, {width}) for a store of {shape.layers} layers "
                f"x {shape.width}"
            )
        expected = max(0, max(0, prompt + output - 1) - start)
        if n != expected:
            raise self._refuse(
                f"{n} rows from position {start}; a turn of {prompt} + {output} tokens has "
                f"{expected} there"
            )
        flat = rows.reshape(-1).astype(np.int64)
        bad = np.flatnonzero((flat < shape.min) | (flat > shape.max))
        if len(bad):
            at = int(bad[0])
            raise self._refuse(
                f"value {flat[at]} at row {at // shape.row} is outside [{shape.min}, {shape.max}]"
            )

    def append(self, given: Given, origin: int, full: int) -> None:
        """Store a checked input for the next turn, whose positions before `origin` are its
        parents' and which has `full` tokens."""
        empty = np.zeros((0, self.shape.layers, self.shape.width), dtype=self.shape.dtype)
        if given is None or isinstance(given, int):
            status = NOT_REQUESTED if given is None else given
            self.turns.append(_TapeTurn(origin, empty, status))
            return
        start, rows = given
        own_from, end = max(origin, start), max(0, full - 1)
        own = rows[own_from - start : end - start] if own_from < end else empty
        self.turns.append(_TapeTurn(own_from, own.astype(self.shape.dtype), PRESENT))

    def fill(self, turn: int, lo: int, hi: int, out: RowArray, status: MaskArray) -> None:
        """Fill positions `lo..hi` of `turn`'s sequence, at or after its origin and before its
        last token."""
        entry = self.turns[turn]
        if entry.status != PRESENT:
            status[lo:hi] = entry.status
            return
        gap_end = min(max(entry.start, lo), hi)
        status[lo:gap_end] = RERENDERED_PREFIX
        if gap_end < hi:
            out[gap_end:hi] = entry.rows[gap_end - entry.start : hi - entry.start]
