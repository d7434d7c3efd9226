"""A time budget for one chat-template render: a template is code, and one that loops on some
input (a marker in a message) would hold a worker for as long as it spins.

`within(seconds, fn)` runs `fn` in the calling thread; one watchdog thread, shared by every
render, raises an exception inside that thread when the render is still running at its
deadline (`PyThreadState_SetAsyncExc`: it arrives at the template's next Python step, and a
Jinja template is Python code throughout). The render then fails with `RenderBudgetExceeded`
and the worker is free again. A render that finishes in time costs a lock and a heap entry.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from tokentrail.errors import RenderBudgetExceeded

__all__ = ["DEFAULT_RENDER_BUDGET_S", "within"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Far above what a real template takes on a real conversation (milliseconds, up to a second for
# ten thousand messages on a loaded machine), far below a harness's request timeout.
DEFAULT_RENDER_BUDGET_S = 10.0


class _Overrun(BaseException):
    """Raised inside a render past its deadline; a BaseException, so no `except Exception` in
    the template's own Python (filters, globals) can swallow it."""


class _Ticket:
    __slots__ = ("deadline", "done", "fired", "thread")

    def __init__(self, thread: int, deadline: float) -> None:
        self.thread = thread
        self.deadline = deadline
        self.done = False
        self.fired = False


def _interrupt(thread: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` in `thread` at its next Python step (None: clear one not yet raised)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread), ctypes.py_object(exc) if exc is not None else None
    )


class _Watchdog:
    """One thread that interrupts the renders past their deadlines."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Ticket]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> _Ticket:
        ticket = _Ticket(threading.get_ident(), time.monotonic() + seconds)
        with self._cond:
            heapq.heappush(self._heap, (ticket.deadline, next(self._order), ticket))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tokentrail-render-budget", daemon=True
                )
                self._thread.start()
            if self._heap[0][2] is ticket:
                self._cond.notify()
        return ticket

    def disarm(self, ticket: _Ticket) -> bool:
        """Whether the render overran; from here on nothing is raised in its thread."""
        with self._cond:
            ticket.done = True
            if ticket.fired:
                _interrupt(ticket.thread, None)
            return ticket.fired

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._heap and (self._heap[0][2].done or self._heap[0][0] <= now):
                    _, _, ticket = heapq.heappop(self._heap)
                    if not ticket.done:
                        ticket.fired = True
                        _interrupt(ticket.thread, _Overrun)
                self._cond.wait(self._heap[0][0] - now if self._heap else None)


_WATCHDOG = _Watchdog()


def within(seconds: float, fn: Callable[[], T], what: str = "the chat template") -> T:
    """`fn()`, or `RenderBudgetExceeded` once it has run `seconds` (0: no budget)."""
    if not seconds:
        return fn()
    ticket = _WATCHDOG.arm(seconds)
    overran = False
    try:
        return fn()
    except _Overrun:
        overran = True
    finally:
        # The watchdog raises at most once; it may land here, before `disarm` clears it.
        while True:
            try:
                overran = _WATCHDOG.disarm(ticket) or overran
                break
            except _Overrun:
                overran = True
        if overran:
            # The operator's template, not the harness, is at fault: they must hear of it.
            logger.warning("%s ran past its render budget of %g s and was stopped", what, seconds)
            raise RenderBudgetExceeded(
                f"{what} ran past its render budget ({seconds:g} s, --render-budget) on this "
                "request: it loops on something in it; nothing was generated or recorded"
            )
    raise AssertionError("unreachable")  # pragma: no cover
