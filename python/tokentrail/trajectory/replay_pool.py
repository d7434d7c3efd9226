"""Replay rows of open sessions within a memory budget: each session's rows (routed experts,
indexer top-k) by row number, on the heap while all sessions' rows together stay within the
pool's `max_bytes`, and in a file of the session's own past it.

A session whose rows are pooled has a `TurnStore` whose tapes hold, per position, the number of
its row here (4 bytes, not `layers x k`), so which turn's row each sample position takes is
still the store's to say (`rust/store.rs`); `SessionRows.read` turns those numbers back into
rows, byte for byte the ones the store would have kept. The session whose next rows would take
the heap past the budget moves all of its rows to a file and appends there from then on; at
finish they are read back through a memory map and the file is deleted. No descriptor stays
open between turns (a spilled session costs none of the connections' file limit); the files
live in a directory of the process's own, removed at exit, and a later pool removes those of
processes that were killed.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import re
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tokentrail.core.ids import MaskArray, RowArray
from tokentrail.core.routing import IndexerShape, ReplayRows, RoutingShape
from tokentrail.errors import ReplayError
from tokentrail.kinds import Replay
from tokentrail.trajectory.sample import RowRead
from tokentrail.trajectory.turn import CheckedTurn

if TYPE_CHECKING:
    from tokentrail import _core

logger = logging.getLogger(__name__)

__all__ = ["NUMBERED_INDEXER", "NUMBERED_ROUTING", "ReplayArgs", "ReplayPool", "SessionRows"]

# The store's tapes of a pooled session: one row number per position. A routed-experts tape
# holds values up to `num_experts - 1` as uint32; an indexer tape holds int32.
NUMBERED_ROUTING = (1, 1, 2**32 - 1)
NUMBERED_INDEXER = (1, 1)
# `REPLAY_STATUS[0]`: a position that has its row.
_PRESENT = 0
# A pool's directory, named for its process.
_DIR_PREFIX = "tokentrail-replay-"
_DIR_NAME = re.compile(re.escape(_DIR_PREFIX) + r"(\d+)-\w+")

# What the store is given for a tape: None, a gap's reason, or `(start, rows)`.
StoreArg = str | tuple[int, RowArray] | None
# Per channel, what the store is given for a turn, and the rows to keep once it took it.
ReplayArgs = dict[Replay, tuple[StoreArg, RowArray | None]]


class ReplayPool:
    """The replay rows of one manager's sessions: `max_bytes` of them on the heap, the rest in
    a file per session and channel, in a directory of the pool's own under `directory` (the
    system's temporary directory if None; not a tmpfs, whose files are memory).
    `max_bytes=0` puts every session's rows in a file."""

    def __init__(self, max_bytes: int, directory: str | None = None) -> None:
        if max_bytes < 0:
            raise ReplayError(f"replay memory must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self.directory = directory
        self._lock = threading.Lock()
        self._heap = 0
        self._spilled = 0
        self._sessions_spilled = 0
        self._files = itertools.count()
        self._dir: Path | None = None
        # No file could be made for a session past the budget: rows past it stay on the heap.
        self.failed = False

    def _new_file(self, channel: Replay) -> Path:
        """A path for a spilled tape, in the pool's directory (made on first use)."""
        with self._lock:
            if self._dir is None:
                _remove_orphans(self.directory)
                made = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=self.directory)
                self._dir = Path(made)
                weakref.finalize(self, shutil.rmtree, made, ignore_errors=True)
            path = self._dir / f"{next(self._files)}-{channel}.rows"
        path.touch()
        return path

    @property
    def heap_bytes(self) -> int:
        """Bytes of rows held on the heap, across the open sessions."""
        return self._heap

    @property
    def spilled_bytes(self) -> int:
        """Bytes of rows the open sessions hold in their files."""
        return self._spilled

    @property
    def sessions_spilled(self) -> int:
        """Sessions whose rows moved to a file since the pool was made."""
        return self._sessions_spilled

    def open(self, routing: RoutingShape | None, indexer: IndexerShape | None) -> SessionRows:
        """The rows of a new session that keeps these channels."""
        tapes = {}
        if routing is not None:
            tapes[Replay.ROUTED_EXPERTS] = _Tape(routing)
        if indexer is not None:
            tapes[Replay.INDEXER_TOPK] = _Tape(indexer)
        return SessionRows(self, tapes)

    def _take(self, nbytes: int) -> bool:
        """Count `nbytes` more on the heap if the budget has room for them."""
        with self._lock:
            if self._heap + nbytes > self.max_bytes:
                return False
            self._heap += nbytes
            return True

    def _moved(self, heap: int, spilled: int, *, first: bool = False) -> None:
        with self._lock:
            self._heap += heap
            self._spilled += spilled
            self._sessions_spilled += first


@dataclass
class _Tape:
    """One channel's rows of one session, numbered from 0 in the order they came."""

    shape: RoutingShape | IndexerShape
    chunks: list[npt.NDArray[np.integer]] = field(default_factory=list)
    # The row number after each chunk's last (cumulative counts).
    ends: list[int] = field(default_factory=list)
    rows: int = 0
    file: Path | None = None

    @property
    def dtype(self) -> np.dtype:
        if isinstance(self.shape, RoutingShape):
            return self.shape.dtype
        return np.dtype(np.int32)

    @property
    def row_shape(self) -> tuple[int, int]:
        return self.shape.layers, self.shape.top_k

    @property
    def row_bytes(self) -> int:
        return self.shape.layers * self.shape.top_k * self.dtype.itemsize

    @property
    def heap_bytes(self) -> int:
        return sum(int(c.nbytes) for c in self.chunks)

    def view(self) -> npt.NDArray[np.integer] | None:
        """The rows in the file, mapped read-only (None when they are on the heap)."""
        if self.file is None:
            return None
        if not self.rows:
            return np.zeros((0, *self.row_shape), self.dtype)
        return np.memmap(self.file, self.dtype, "r", shape=(self.rows, *self.row_shape))

    def copy_into(self, out: RowArray, first: int, mapped: RowArray | None) -> None:
        """Rows `first..first + len(out)` into `out`."""
        if mapped is not None:
            out[:] = mapped[first : first + len(out)]
            return
        at, done = bisect.bisect_right(self.ends, first), 0
        while done < len(out):
            begin = self.ends[at - 1] if at else 0
            chunk = self.chunks[at][first + done - begin :]
            n = min(len(chunk), len(out) - done)
            out[done : done + n] = chunk[:n]
            done, at = done + n, at + 1


class SessionRows:
    """One session's pooled rows. `numbered` turns a turn's rows into what its store keeps
    (row numbers) and `keep` holds the rows; `read` gives rows back by those numbers."""

    def __init__(self, pool: ReplayPool, tapes: dict[Replay, _Tape]) -> None:
        self._pool = pool
        self._tapes = tapes

    @property
    def spilled(self) -> bool:
        """Whether the session's rows live in files rather than on the heap."""
        return any(tape.file is not None for tape in self._tapes.values())

    @property
    def heap_bytes(self) -> int:
        return sum(tape.heap_bytes for tape in self._tapes.values())

    def view(self, channel: Replay) -> RowArray | None:
        """All of the channel's rows in their file, mapped (None while on the heap)."""
        return self._tapes[channel].view()

    def store_args(self, store: _core.TurnStore, parent: int, turn: CheckedTurn) -> ReplayArgs:
        """`numbered` for both channels of a turn that `store` files under `parent`."""

        def origin() -> int:
            return store.replay_start(parent, turn.prompt_ids)

        return {
            Replay.ROUTED_EXPERTS: self.numbered(
                Replay.ROUTED_EXPERTS, turn.routed_experts, origin
            ),
            Replay.INDEXER_TOPK: self.numbered(Replay.INDEXER_TOPK, turn.indexer_topk, origin),
        }

    def reader(self, store: _core.TurnStore) -> RowRead:
        """The session's rows as a linearization reads them: by the numbers `store` holds."""

        def read(channel: Replay, turn: int, length: int) -> tuple[RowArray, MaskArray]:
            tape = store.routed_experts if channel is Replay.ROUTED_EXPERTS else store.indexer_topk
            numbers, status = tape(turn, length)
            return self.read(channel, numbers, status), status

        return read

    def numbered(
        self, channel: Replay, given: ReplayRows | None, origin: Callable[[], int]
    ) -> tuple[StoreArg, RowArray | None]:
        """What the store is given for `channel` (row numbers for `given`'s rows), and the rows
        to `keep`. `origin()` is where the turn's own positions
        start (`TurnStore.replay_start`): rows before it are its parents', and not kept."""
        if given is None or given.rows is None:
            return (None if given is None else given.store_arg()), None
        tape = self._tapes.get(channel)
        rows = np.asarray(given.rows)
        if tape is None:  # the store refuses it, naming the channel
            return (given.start, rows), None
        _check(channel, tape, rows)
        skip = min(len(rows), max(0, origin() - given.start))
        numbers = np.zeros((len(rows), 1, 1), np.int64)
        numbers[skip:, 0, 0] = np.arange(tape.rows, tape.rows + len(rows) - skip)
        return (given.start, numbers), rows[skip:]

    def keep(self, replay: ReplayArgs) -> Callable[[], None]:
        """Hold the rows `numbered` gave for a turn, before the store takes it; the undo, for
        a store that refuses it."""
        before = {channel: (tape.rows, len(tape.chunks)) for channel, tape in self._tapes.items()}
        try:
            for channel, (_, rows) in replay.items():
                self._keep(channel, rows)
        except BaseException:
            self._undo(before)
            raise
        return lambda: self._undo(before)

    def _undo(self, before: dict[Replay, tuple[int, int]]) -> None:
        heap = spilled = 0
        for channel, (rows, chunks) in before.items():
            tape = self._tapes[channel]
            if tape.file is not None:
                spilled += (tape.rows - rows) * tape.row_bytes
                os.truncate(tape.file, rows * tape.row_bytes)
            else:
                heap += sum(int(c.nbytes) for c in tape.chunks[chunks:])
                del tape.chunks[chunks:], tape.ends[chunks:]
            tape.rows = rows
        self._pool._moved(-heap, -spilled)

    def _keep(self, channel: Replay, rows: RowArray | None) -> None:
        if rows is None or not len(rows):
            return
        tape = self._tapes[channel]
        nbytes = len(rows) * tape.row_bytes
        if not self.spilled:
            if not self._pool._take(nbytes) and not self._spill():
                self._pool._moved(nbytes, 0)  # no file to spill to: past the budget, not lost
            if not self.spilled:
                # A copy of its own, as the store would keep: `rows` may be a slice of an
                # engine's larger answer.
                tape.chunks.append(np.array(rows, dtype=tape.dtype, order="C"))
                tape.rows += len(rows)
                tape.ends.append(tape.rows)
                return
        assert tape.file is not None
        with tape.file.open("ab") as f:
            f.write(np.ascontiguousarray(rows, dtype=tape.dtype).data)
        tape.rows += len(rows)
        self._pool._moved(0, nbytes)

    def _spill(self) -> bool:
        """Move every channel's rows to a file of its own; False where no file can be made."""
        try:
            files = {channel: self._pool._new_file(channel) for channel in self._tapes}
        except OSError as exc:
            if not self._pool.failed:
                logger.warning(
                    "replay rows past the budget stay on the heap: no file in %s (%s)",
                    self._pool.directory or tempfile.gettempdir(),
                    exc,
                )
            self._pool.failed = True
            return False
        try:  # all written before any tape changes: a failed write leaves the heap as it was
            for channel, tape in self._tapes.items():
                with files[channel].open("ab") as f:
                    for chunk in tape.chunks:
                        f.write(chunk.data)
        except BaseException:
            for path in files.values():
                path.unlink(missing_ok=True)
            raise
        moved = self.heap_bytes
        for channel, tape in self._tapes.items():
            tape.file, tape.chunks, tape.ends = files[channel], [], []
        self._pool._moved(-moved, moved, first=True)
        logger.debug(
            "replay rows over the pool's %d bytes: %d bytes moved to files",
            self._pool.max_bytes,
            moved,
        )
        return True

    def read(self, channel: Replay, numbers: RowArray, status: MaskArray) -> RowArray:
        """The rows the store's `numbers` (`[n, 1, 1]`) name, zeros where `status` says a
        position has none: what the store would have answered had it kept the rows."""
        tape = self._tapes[channel]
        out = np.zeros((len(status), *tape.row_shape), tape.dtype)
        present = np.flatnonzero(np.asarray(status) == _PRESENT)
        if not present.size:
            return out
        ids = np.asarray(numbers).reshape(-1)[present].astype(np.int64)
        # Runs of consecutive positions holding consecutive rows: one copy each.
        breaks = (np.flatnonzero((np.diff(present) != 1) | (np.diff(ids) != 1)) + 1).tolist()
        mapped = tape.view()
        for lo, hi in zip([0, *breaks], [*breaks, len(present)], strict=True):
            at = int(present[lo])
            tape.copy_into(out[at : at + hi - lo], int(ids[lo]), mapped)
        del mapped  # unmapped: the rows are `out`'s own
        return out

    def close(self) -> None:
        """Give the rows back: the heap's to the pool, the files deleted."""
        heap = spilled = 0
        for tape in self._tapes.values():
            heap += tape.heap_bytes
            if tape.file is not None:
                spilled += tape.rows * tape.row_bytes
                tape.file.unlink(missing_ok=True)
                tape.file = None
            tape.chunks, tape.ends, tape.rows = [], [], 0
        self._pool._moved(-heap, -spilled)


def _remove_orphans(directory: str | None) -> None:
    """Remove the pool directories of processes that no longer run (killed before exit)."""
    where = Path(directory or tempfile.gettempdir())
    try:
        found = list(where.glob(f"{_DIR_PREFIX}*"))
    except OSError:
        return
    for path in found:
        match = _DIR_NAME.fullmatch(path.name)
        if match is None or not path.is_dir() or _running(int(match.group(1))):
            continue
        logger.info("removing the replay rows of a process that is gone: %s", path)
        shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def _check(channel: Replay, tape: _Tape, rows: np.ndarray) -> None:
    """Refuse rows that do not fit the channel's shape and range, as the store would."""
    if rows.ndim != 3 or rows.dtype.kind not in "iu":
        raise ReplayError(
            f"{channel}: rows must be a 3-D integer array, got {rows.dtype}{rows.shape}"
        )
    layers, width = tape.row_shape
    if rows.shape[1:] != (layers, width):
        raise ReplayError(
            f"{channel}: rows of shape {tuple(rows.shape)} for a store of {layers} layers x {width}"
        )
    if not rows.size:
        return
    low, high = (
        (0, tape.shape.num_experts - 1) if isinstance(tape.shape, RoutingShape) else (-1, 2**31 - 1)
    )
    if int(rows.min()) < low or int(rows.max()) > high:
        flat = rows.reshape(-1)
        at = int(np.flatnonzero((flat < low) | (flat > high))[0])
        raise ReplayError(
            f"{channel}: value {int(flat[at])} at row {at // (layers * width)} is outside "
            f"[{low}, {high}]"
        )
