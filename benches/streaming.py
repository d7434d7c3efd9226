"""Streaming a turn to the harness as it is sampled (`serve --engine-stream`): how soon the
harness hears the engine's first token, and what a streamed turn costs in CPU against one
generated whole.

A stand-in SGLang (tests/support/fake_engines.py, its own process so its CPU is not counted)
streams `/generate` as SGLang does, one token an event (its default `--stream-interval`),
cumulative (SGLang's default) or incremental (`--incremental-streaming-output`). The adapter
and an aiohttp client run in this process over loopback.

- first byte: the client's receipt of the first `content_block_delta` minus the stand-in's
  write of its first token event (one clock, one machine), over many turns (a fresh session
  each), the reply plain text so its first token is handed out at once;
- CPU: this process's CPU time (adapter and client together) per turn of L tokens, streamed
  (engine stream and live reply) against whole (the engine answer read whole, the reply's
  SSE written once the turn is done), the stand-in's CPU not counted.

    python benches/streaming.py [--turns 300] [--lengths 500,2000]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import aiohttp  # noqa: E402

from tokentrail.adapter.server import Adapter, AdapterConfig, start_server  # noqa: E402
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


async def run_turns(engine_url: str, live: bool, turns: int) -> tuple[list[float], float]:
    tokenizer = load_tokenizer()
    engine = SGLangEngine(engine_url, stream=live)
    adapter = Adapter(
        engine=engine,
        tokenizer=tokenizer,
        config=AdapterConfig(live_stream=live, workers=0, max_sessions=0),
    )
    runner, url = await start_server(adapter)
    firsts = []
    try:
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


def first_byte(turns: int) -> list[float]:
    """Milliseconds from the stand-in's first token event to the client's first delta."""
    from support.fake_engines import FakeSGLang

    ids = reply_ids(64)

    async def go() -> list[float]:
        fake = FakeSGLang(lambda _p: (list(ids), [-0.5] * len(ids), "stop"))
        async with fake as srv:
            firsts, _ = await run_turns(srv.url, True, turns)
            sent = [times[0] for times in list(srv.streamed_at.values())[1:]]
        return [(f - s) * 1000 for f, s in zip(firsts, sent, strict=True)]

    return asyncio.run(go())


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--cpu-turns", type=int, default=20)
    parser.add_argument("--lengths", default="500,2000")
    args = parser.parse_args()

    lat = first_byte(args.turns)
    print(f"first byte the harness sees after the engine's first token ({len(lat)} turns)")
    print("| p50 ms | p99 ms | max ms |")
    print("|---:|---:|---:|")
    print(f"| {statistics.median(lat):.2f} | {pct(lat, 99):.2f} | {max(lat):.2f} |")
    print()
    print("CPU per turn, adapter and client (ms), streamed as sampled vs generated whole")
    print("| tokens | SGLang stream | whole | streamed | streamed / whole |")
    print("|---:|---|---:|---:|---:|")
    for n in (int(x) for x in args.lengths.split(",")):
        ids = reply_ids(n)
        for incremental in (False, True):
            with StandIn(ids, incremental) as url:
                _, whole = asyncio.run(run_turns(url, False, args.cpu_turns))
                _, live = asyncio.run(run_turns(url, True, args.cpu_turns))
            mode = "incremental" if incremental else "cumulative (default)"
            print(f"| {n} | {mode} | {whole * 1000:.1f} | {live * 1000:.1f} | {live / whole:.2f} |")
    print()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}, {platform.python_implementation()} {platform.python_version()}"
    )


if __name__ == "__main__":
    main()
