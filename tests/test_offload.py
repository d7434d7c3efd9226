"""The worker pool the adapter's CPU-heavy steps run in: a session's steps one at a time and in
order, other sessions' alongside, and a cancelled caller's step still finishing first."""

from __future__ import annotations

import asyncio
import threading

from tokentrail.adapter.offload import Offload


def test_one_sessions_steps_never_overlap_and_keep_their_order() -> None:
    offload = Offload(4)
    running: dict[str, int] = {"a": 0, "b": 0}
    most = {"a": 0, "b": 0}
    order: list[tuple[str, int]] = []
    both = threading.Barrier(2, timeout=10)
    lock = threading.Lock()

    def step(sid: str, k: int) -> int:
        with lock:
            running[sid] += 1
            most[sid] = max(most[sid], running[sid])
            order.append((sid, k))
        if k == 0:
            both.wait()  # a's and b's first steps must be able to run at the same time
        with lock:
            running[sid] -= 1
        return k

    async def body() -> list[int]:
        calls = [offload.run(step, sid, k, session=sid) for k in range(20) for sid in ("a", "b")]
        return await asyncio.gather(*calls)

    results = asyncio.run(body())
    offload.close()
    assert results == [k for k in range(20) for _ in ("a", "b")]
    assert most == {"a": 1, "b": 1}
    for sid in ("a", "b"):
        assert [k for s, k in order if s == sid] == list(range(20))
    assert offload.lanes == 0


def test_a_cancelled_step_still_runs_before_the_sessions_next() -> None:
    offload = Offload(2)
    release = threading.Event()
    log: list[str] = []

    def slow() -> None:
        release.wait(10)
        log.append("slow")

    def after() -> None:
        log.append("after")

    async def body() -> None:
        first = asyncio.create_task(offload.run(slow, session="s"))
        await asyncio.sleep(0.05)
        first.cancel()
        second = asyncio.create_task(offload.run(after, session="s"))
        await asyncio.sleep(0.05)
        assert log == []  # the cancelled step holds the session
        release.set()
        await second

    asyncio.run(body())
    offload.close()
    assert log == ["slow", "after"]


def test_inline_mode_runs_on_the_loop() -> None:
    offload = Offload(0)
    loop_thread = threading.get_ident()

    async def body() -> int:
        return await offload.run(threading.get_ident, session="s")

    assert asyncio.run(body()) == loop_thread
