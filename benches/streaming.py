"""Streaming a turn to the harness as it is sampled (`serve --engine-stream`): how soon the
harness hears the engine's first token, and what a streamed turn costs in CPU against one
generated whole.

A stand-in SGLang (tests/support/fake_engines.py) streams `/generate` as SGLang does, one token
an event (its default `--stream-interval`), cumulative (SGLang's default) or incremental
(`--incremental-streaming-output`). The adapter runs in this process over loopback.

- first byte: the client's receipt of the first `content_block_delta` minus the stand-in's
  write of its first token event (perf_counter: one monotonic clock across processes), over
  many turns (a fresh session each), the reply plain text so its first token is handed out at
  once, the events `--token-delay` apart (0: the whole answer as fast as the stand-in writes
  it). Three placements: the stand-in and the client (the harness) in this process's loop
  (as first measured: the stand-in's writing and its records of every event it sent, which
  the adapter's garbage collections then walk, share the adapter's loop and heap), then the
  stand-in in a process of its own, then both, as a real engine and harness are. Each turn is
  broken into stages from timestamps taken in this process (the engine client's first event,
  `LiveReply.sink`, the first frame's write) and the garbage collections inside it; a client
  in its own process can read before the write call returns, hence a stage a hair below 0.
  `LiveReply.sink CPU per call` is this thread's CPU per run of tokens taken (decode, parse,
  the protocol's delta), which load inflates less than wall time;
- CPU: this process's CPU time (adapter and client together) per turn of L tokens, streamed
  (engine stream and live reply) against whole (the engine answer read whole, the reply's
  SSE written once the turn is done), the stand-in (its own process) not counted: `--rounds`
  rounds of `--cpu-turns` turns each way, whole and streamed alternating (which goes first
  alternates too), so that what the machine's load does to one side it does to the other;
  the medians, their ratio, and the range of the rounds' own ratios.

    python benches/streaming.py [--turns 300] [--lengths 500,2000] [--token-delay 0]
        [--cpu-turns 10] [--rounds 5] [--cpu-only | --first-byte-only]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import multiprocessing
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import aiohttp  # noqa: E402
from report import machine  # noqa: E402

import tokentrail.adapter.turn.turns as turns_module  # noqa: E402
import tokentrail.engines.http as engines_http  # noqa: E402
from tokentrail.adapter.http.server import (  # noqa: E402
    Adapter,
    AdapterConfig,
    freeze_startup_heap,
    start_server,
)
from tokentrail.adapter.turn.live import LiveReply  # noqa: E402
from tokentrail.engines.sglang import SGLangEngine  # noqa: E402
from tokentrail.text.tokenizer import load_tokenizer  # noqa: E402

BODY = {
    "model": "m",
    "max_tokens": 8192,
    "system": "You are a coding agent.",
    "messages": [{"role": "user", "content": "Explain the plan."}],
}


def reply_ids(n: int) -> list[int]:
    tokenizer = load_tokenizer()
    unit = tokenizer.encode("Sure, here is the plan: read the module, then edit it. ")
    ids = (unit * (n // len(unit) + 1))[: n - 1]
    return [*ids, tokenizer.token_id("<|im_end|>")]


def _stand_in(ids: list[int], incremental: bool, urls: Any, stop: Any) -> None:
    from support.fake_engines import FakeSGLang

    async def run() -> None:
        fake = FakeSGLang(
            lambda _p: (list(ids), [-0.5] * len(ids), "stop"), incremental=incremental
        )
        async with fake as srv:
            urls.put(srv.url)
            while not stop.is_set():
                await asyncio.sleep(0.05)

    asyncio.run(run())


class StandIn:
    def __init__(self, ids: list[int], incremental: bool) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.urls, self.stop = ctx.Queue(), ctx.Event()
        self.proc = ctx.Process(target=_stand_in, args=(ids, incremental, self.urls, self.stop))

    def __enter__(self) -> str:
        self.proc.start()
        return self.urls.get(timeout=60)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.proc.join(30)


async def one_turn(http: aiohttp.ClientSession, url: str, stream: bool) -> float:
    """A streamed request in a fresh session; when its first delta arrived (perf_counter)."""
    first = 0.0
    headers = {"x-api-key": uuid.uuid4().hex}
    async with http.post(
        f"{url}/v1/messages", json={**BODY, "stream": stream}, headers=headers
    ) as r:
        assert r.status == 200, await r.text()
        async for chunk in r.content.iter_any():
            if not first and b"content_block_delta" in chunk:
                first = time.perf_counter()
    return first


def _client(url: str, turns: int, out: Any) -> None:
    """The harness in a process of its own: `turns` + 1 streamed turns, their first deltas."""

    async def run() -> list[float]:
        async with aiohttp.ClientSession() as http:
            return [await one_turn(http, url, True) for _ in range(turns + 1)]

    out.put(asyncio.run(run()))


async def run_turns(
    engine_url: str, live: bool, turns: int, own_client: bool = False
) -> tuple[list[float], float]:
    tokenizer = load_tokenizer()
    engine = SGLangEngine(engine_url, stream=live)
    adapter = Adapter(
        engine=engine,
        tokenizer=tokenizer,
        config=AdapterConfig(live_stream=live, workers=0, max_sessions=0),
    )
    runner, url = await start_server(adapter)
    freeze_startup_heap()  # as `tokentrail serve` does once it listens
    firsts = []
    try:
        if own_client:
            ctx = multiprocessing.get_context("spawn")
            out = ctx.Queue()
            proc = ctx.Process(target=_client, args=(url, turns, out))
            proc.start()
            while proc.is_alive() and out.empty():
                await asyncio.sleep(0.05)
            firsts = out.get(timeout=60)[1:]  # the first a warm-up
            proc.join(30)
            return firsts, 0.0
        async with aiohttp.ClientSession() as http:
            await one_turn(http, url, True)  # warm up
            cpu = time.process_time()
            for _ in range(turns):
                firsts.append(await one_turn(http, url, True))
            cpu = time.process_time() - cpu
    finally:
        await runner.cleanup()
        await engine.close()
    return firsts, cpu / turns


class Stages:
    """Timestamps (perf_counter) of each turn's first token on its way to the client, taken
    by wrapping the adapter's parts in this process; the turn's LiveReply gives its own."""

    def __init__(self) -> None:
        self.replies: list[LiveReply] = []
        self.first_event: list[float] = []
        self.sink_cpu_ns = 0
        self.sink_calls = 0
        self.gc_pauses: list[tuple[float, float]] = []
        self._gc_start = 0.0

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        stages = self

        class Recorded(LiveReply):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                stages.replies.append(self)

            def sink(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
                cpu = time.thread_time_ns()
                super().sink(ids, logprobs)
                stages.sink_cpu_ns += time.thread_time_ns() - cpu
                stages.sink_calls += 1

        original_events = engines_http.sse_events

        async def events(resp: Any, limit: int, *pauses: float) -> AsyncIterator[list[Any]]:
            first = True
            async for run in original_events(resp, limit, *pauses):
                if first:
                    stages.first_event.append(time.perf_counter())
                    first = False
                yield run

        def on_gc(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                self._gc_start = time.perf_counter()
            else:
                self.gc_pauses.append((self._gc_start, time.perf_counter()))

        saved = turns_module.LiveReply
        turns_module.LiveReply = Recorded  # type: ignore[misc]
        engines_http.sse_events = events  # type: ignore[assignment]
        gc.callbacks.append(on_gc)
        try:
            yield
        finally:
            turns_module.LiveReply = saved  # type: ignore[misc]
            engines_http.sse_events = original_events
            gc.callbacks.remove(on_gc)


def _stand_in_timed(ids: list[int], urls: Any, stop: Any, times: Any) -> None:
    from support.fake_engines import FakeSGLang

    async def run() -> None:
        fake = FakeSGLang(lambda _p: (list(ids), [-0.5] * len(ids), "stop"))
        async with fake as srv:
            urls.put(srv.url)
            while not stop.is_set():
                await asyncio.sleep(0.05)
            times.put([t[0] for t in srv.streamed_at.values()])

    asyncio.run(run())


def first_byte(
    turns: int, own_process: bool, own_client: bool, tokens: int, token_delay_s: float
) -> dict[str, list[float]]:
    """Milliseconds from the stand-in's first token event to the client's first delta, and
    the stages between, per turn (warm-up turn left out)."""
    from support.fake_engines import FakeSGLang

    ids = reply_ids(tokens)
    stages = Stages()

    async def in_loop() -> tuple[list[float], list[float]]:
        fake = FakeSGLang(
            lambda _p: (list(ids), [-0.5] * len(ids), "stop"), token_delay_s=token_delay_s
        )
        async with fake as srv:
            firsts, _ = await run_turns(srv.url, True, turns)
            sent = [times[0] for times in srv.streamed_at.values()]
        return firsts, sent

    with stages.watching():
        if own_process:
            ctx = multiprocessing.get_context("spawn")
            urls, stop, times = ctx.Queue(), ctx.Event(), ctx.Queue()
            proc = ctx.Process(target=_stand_in_timed, args=(ids, urls, stop, times))
            proc.start()
            try:
                firsts, _ = asyncio.run(run_turns(urls.get(timeout=60), True, turns, own_client))
                stop.set()
                sent = times.get(timeout=60)
            finally:
                stop.set()
                proc.join(30)
        else:
            firsts, sent = asyncio.run(in_loop())
    rows: dict[str, list[float]] = {k: [] for k in STAGES}
    for i in range(1, len(sent)):
        reply = stages.replies[i]
        if reply.first_token_at is None or reply.first_write_at is None:
            continue
        marks = [
            sent[i],
            stages.first_event[i],
            reply.first_token_at,
            reply.first_write_at,
            firsts[i - 1],
        ]
        for (name, _), a, b in zip(STAGES.items(), marks, marks[1:], strict=False):
            rows[name].append((b - a) * 1000)
        rows["first byte"].append((marks[-1] - marks[0]) * 1000)
        rows["GC pause inside"].append(
            sum(
                (min(e, marks[-1]) - max(s, marks[0])) * 1000
                for s, e in stages.gc_pauses
                if s < marks[-1] and e > marks[0]
            )
        )
    rows["sink CPU per call"] = [stages.sink_cpu_ns / max(1, stages.sink_calls) / 1e6]
    return rows


# Each stage: from the previous mark to this one.
STAGES = {
    "stand-in write -> engine client has the event": "",
    "-> LiveReply.sink (JSON, capture)": "",
    "-> first frame written (decode, parse, delta, writer wake-up, write)": "",
    "-> client reads it": "",
    "first byte": "",
    "GC pause inside": "",
}


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--cpu-turns", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lengths", default="500,2000")
    parser.add_argument("--first-tokens", type=int, default=64)
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument("--cpu-only", action="store_true", help="only the CPU table")
    parser.add_argument("--first-byte-only", action="store_true", help="only first-byte tables")
    args = parser.parse_args()

    # The stand-in and the client (the harness) in this process's loop, as measured before;
    # then each in a process of its own, as a real engine and harness are.
    placements = () if args.cpu_only else ((False, False), (True, False), (True, True))
    for own_process, own_client in placements:
        rows = first_byte(args.turns, own_process, own_client, args.first_tokens, args.token_delay)
        where = (
            f"stand-in in {'its own process' if own_process else 'this loop'}, "
            f"client in {'its own process' if own_client else 'this loop'}"
        )
        lat = rows["first byte"]
        print(
            f"first byte the harness sees after the engine's first token ({len(lat)} turns of "
            f"{args.first_tokens} tokens, {args.token_delay * 1000:g} ms apart; "
            f"{where})"
        )
        print("| stage | p50 ms | p99 ms | max ms |")
        print("|---|---:|---:|---:|")
        for name in STAGES:
            v = rows[name]
            print(f"| {name} | {statistics.median(v):.2f} | {pct(v, 99):.2f} | {max(v):.2f} |")
        cpu = rows["sink CPU per call"][0]
        print(f"| LiveReply.sink CPU per call (decode, parse, delta) | {cpu:.3f} | | |")
        print()
    if args.first_byte_only:
        print(f"machine: {machine()}")
        return
    print(
        f"CPU per turn, adapter and client (ms, process CPU per turn over {args.cpu_turns} turns; "
        f"median of {args.rounds} rounds, whole and streamed alternating), streamed as sampled "
        "vs generated whole"
    )
    print("| tokens | SGLang stream | whole | streamed | streamed / whole | rounds' ratios |")
    print("|---:|---|---:|---:|---:|---|")
    for n in (int(x) for x in args.lengths.split(",")):
        ids = reply_ids(n)
        for incremental in (False, True):
            wholes, lives = [], []
            with StandIn(ids, incremental) as url:
                for k in range(args.rounds):
                    for live in (False, True) if k % 2 == 0 else (True, False):
                        _, cpu = asyncio.run(run_turns(url, live, args.cpu_turns))
                        (lives if live else wholes).append(cpu * 1000)
            whole, live = statistics.median(wholes), statistics.median(lives)
            ratios = sorted(b / a for a, b in zip(wholes, lives, strict=True))
            mode = "incremental" if incremental else "cumulative (default)"
            print(
                f"| {n} | {mode} | {whole:.1f} | {live:.1f} | {live / whole:.2f} | "
                f"{ratios[0]:.2f}-{ratios[-1]:.2f} |"
            )
    print()
    print(f"machine: {machine()}")


if __name__ == "__main__":
    main()
