"""CPU work of a request, run off the event loop so one heavy request cannot stall the others.

Parsing a body, translating it, rendering, tokenizing, parsing the output, recording, finishing
and journal writes run in a bounded pool of threads; the loop only reads and writes sockets.
The Rust core and the tokenizer release the GIL while they work; Python steps hand it back to
the loop every switch interval. The steps of one session run one at a time, in the order they
were asked for, exactly as they did on the loop: a session's state (its tree, its incremental
encoder, its splice checks) never sees two of its turns interleave inside a step. Journal
writes go through one thread of their own, so they stay in order.

`workers=0` runs every step inline on the loop (the behaviour before this module, kept for
comparison in `benches/loop_responsiveness.py`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import ctypes.util
import gc
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_WORKERS", "Offload", "Settler", "trim_memory"]

T = TypeVar("T")

DEFAULT_WORKERS = max(1, min(4, os.cpu_count() or 1))


class Offload:
    """A pool of worker threads for CPU-heavy steps, one lane per session."""

    def __init__(self, workers: int = DEFAULT_WORKERS) -> None:
        self.workers = workers
        self._pool = (
            ThreadPoolExecutor(workers, thread_name_prefix="tokentrail-work") if workers else None
        )
        self._journal = (
            ThreadPoolExecutor(1, thread_name_prefix="tokentrail-journal") if workers else None
        )
        self._lanes: dict[str, _Lane] = {}
        self._background: set[concurrent.futures.Future[Any]] = set()

    async def run(self, fn: Callable[..., T], *args: Any, session: str | None = None) -> T:
        """`fn(*args)` in a worker; with `session`, after that session's earlier steps.

        A cancelled caller stops waiting, but the step runs to its end and the session's next
        step waits for it, so no step of a session ever overlaps another.
        """
        if self._pool is None:
            return fn(*args)
        loop = asyncio.get_running_loop()
        if session is None:
            return await asyncio.shield(loop.run_in_executor(self._pool, fn, *args))
        lane = self._lanes.get(session)
        if lane is None:
            lane = self._lanes[session] = _Lane()
        lane.users += 1
        try:
            await lane.lock.acquire()
        except BaseException:
            self._leave(session, lane)
            raise
        try:
            future = loop.run_in_executor(self._pool, fn, *args)
        except BaseException:
            lane.lock.release()
            self._leave(session, lane)
            raise

        def done(_: object) -> None:
            lane.lock.release()
            self._leave(session, lane)

        future.add_done_callback(done)
        return await asyncio.shield(future)

    def _leave(self, session: str, lane: _Lane) -> None:
        lane.users -= 1
        if lane.users == 0 and self._lanes.get(session) is lane:
            del self._lanes[session]

    async def journal(self, fn: Callable[..., T], *args: Any) -> T:
        """A journal write, in the one journal thread, after every earlier one. If the caller
        is cancelled while it runs, the write still completes: what the journal holds does not
        depend on whether the client stayed."""
        if self._journal is None:
            return fn(*args)
        done = self._journal.submit(fn, *args)
        return await asyncio.shield(asyncio.wrap_future(done))

    def journal_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """A journal write nobody waits for (an open, a replay, a drop), in order with the others;
        from any thread, with or without a running loop."""
        if self._journal is None:
            fn(*args)
            return
        future = self._journal.submit(fn, *args)
        self._background.add(future)
        future.add_done_callback(self._done_in_background)

    def _done_in_background(self, future: concurrent.futures.Future[Any]) -> None:
        self._background.discard(future)
        if not future.cancelled() and future.exception() is not None:
            logger.error("background journal write failed: %s", future.exception())

    async def drain(self) -> None:
        """Wait for the background writes (at shutdown)."""
        pending = [asyncio.wrap_future(f) for f in list(self._background)]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def close(self) -> None:
        for pool in (self._pool, self._journal):
            if pool is not None:
                pool.shutdown(wait=True)

    @property
    def lanes(self) -> int:
        """Sessions with a step running or waiting (for tests and metrics)."""
        return len(self._lanes)


class _Lane:
    """One session's lock, and how many steps hold or wait for it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


_libc: Any = None
_last_trim = 0.0


def trim_memory(min_interval_s: float = 1.0) -> None:
    """Hand freed heap pages back to the OS (glibc keeps them per thread arena otherwise, so a
    finished 20 MB prompt would stay in the RSS); at most once per `min_interval_s`."""
    global _libc, _last_trim
    now = time.monotonic()
    if now - _last_trim < min_interval_s:
        return
    _last_trim = now
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            _libc = ctypes.CDLL(name) if name else False
        except OSError:
            _libc = False
    if _libc and hasattr(_libc, "malloc_trim"):
        _libc.malloc_trim(0)


# Once the finishes have been quiet this long, their last garbage is collected and trimmed.
SETTLE_S = 1.0


class Settler:
    """A collection and a trim in a worker once `delay_s` passed since the latest `poke`.

    A finish collects and trims as it closes its session, but its last buffers become garbage
    after that: its answer, its request and its connection (reference cycles, which the frozen
    startup heap leaves to rare full collections). Without a later pass the memory of the
    last session of a burst stays in use until the next finish."""

    def __init__(self, offload: Offload, delay_s: float = SETTLE_S) -> None:
        self.offload = offload
        self.delay_s = delay_s
        self._latest = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Future[None]] = set()
        self.settled = 0  # passes run (tests read it)

    def poke(self) -> None:
        """On the loop: something was freed; settle once things are quiet."""
        self._latest = time.monotonic()
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.delay_s, self._due)

    def _due(self) -> None:
        self._timer = None
        wait = self._latest + self.delay_s - time.monotonic()
        if wait > 0:
            self._timer = asyncio.get_running_loop().call_later(wait, self._due)
            return
        task = asyncio.ensure_future(self._settle())
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _settle(self) -> None:
        try:
            await self.offload.run(_collect_and_trim)
        except RuntimeError:  # the pool is shut down: the server is stopping
            return
        self.settled += 1

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _collect_and_trim() -> None:
    gc.collect()
    trim_memory(0.0)
