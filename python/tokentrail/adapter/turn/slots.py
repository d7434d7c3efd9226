"""How many turns, and how many engine calls, run at once: `--max-concurrent-turns` (a turn
past it is refused with a 503 and `Retry-After`) and `--engine-concurrency` (an engine call past
it waits its turn). The caps are `Limits` fields (`adapter.request.limits`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from tokentrail.errors import Overloaded

__all__ = ["EngineSlots", "TurnSlots"]


class EngineSlots:
    """Places among the engine calls `--engine-concurrency` lets run at once (0: no cap), one
    semaphore per event loop (a semaphore belongs to the loop it was first awaited on)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    def slot(self) -> contextlib.AbstractAsyncContextManager[Any]:
        if not self.cap:
            return contextlib.nullcontext()
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.cap))
        return self._slots[1]


class TurnSlots:
    """Turns in flight, server-wide, up to a cap (0: none); past it a turn is refused with a
    503 that a retry can pass once others finish."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.taken = 0

    def take(self) -> None:
        if self.cap and self.taken >= self.cap:
            raise Overloaded(
                f"{self.taken} turns in flight, the adapter's limit (--max-concurrent-turns); "
                "retry shortly",
                retry_after_s=1,
            )
        self.taken += 1

    def give(self) -> None:
        self.taken -= 1
