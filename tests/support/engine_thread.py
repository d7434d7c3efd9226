"""A stand-in engine (`fake_engines`) served from a background thread with its own event loop,
for tests that drive a separate process (`tokentrail serve`, a real harness CLI) against it.

    with engine_in_thread(FakeVLLM(reply)) as fake:
        ... fake.url ...
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

Fake = TypeVar("Fake", bound=Any)


@contextmanager
def engine_in_thread(fake: Fake, start_timeout_s: float = 30.0) -> Iterator[Fake]:
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop: asyncio.Event | None = None

    async def run() -> None:
        nonlocal stop
        stop = asyncio.Event()
        async with fake:
            started.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    if not started.wait(start_timeout_s):
        raise TimeoutError("the stand-in engine did not start")
    try:
        yield fake
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()
