"""`/finish` of a long MoE session: JSON against the binary answers (npz, Arrow IPC).

One session over real sockets and the Anthropic SDK whose prompt is about 80K tokens (Qwen3
vocabulary), against the simulated MoE engine (`sim.moe`) at Qwen3-30B-A3B's shape (48 layers,
top-8 of 128 experts), so every sample carries a `[tokens, 48, 8]` routed-experts array. Then
`/finish` is asked once per format (a repeated finish answers the same samples): the bytes on
the wire, and the client's time from sending the request to holding the samples as numpy
arrays (`storage.finish_wire.read_finish`: the JSON parsed and its lists made arrays; the npz
and Arrow read as they are). Best of `--repeat` runs.

    python benches/finish_binary.py [--tokens 80000] [--repeat 1]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import random
import time
import urllib.request

import anthropic

from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.core.routing import RoutingShape
from tokentrail.sim.model import SimulatedEngine
from tokentrail.sim.moe import MoEEngine
from tokentrail.storage.finish_wire import FinishFormat, read_finish
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.manager import TrajectoryManager

SHAPE = RoutingShape(48, 8, 128)  # Qwen3-30B-A3B
TOKEN = "bench"
WORDS = "the module test fix import value return error class function file line path".split()


def fetch(url: str, accept: str) -> tuple[int, float, int, int]:
    """(bytes, seconds, samples, routed rows) of one `/finish` read into samples."""
    req = urllib.request.Request(
        f"{url}/tokentrail/sessions/long/finish",
        b'{"reward": 1}',
        {"Authorization": f"Bearer {TOKEN}", "Accept": accept},
        method="POST",
    )
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as resp:
        body = resp.read()
        answer = read_finish(body, resp.headers["Content-Type"])
    seconds = time.perf_counter() - start
    rows = sum(len(s.routed_experts) for s in answer.samples if s.routed_experts is not None)
    return len(body), seconds, len(answer.samples), rows


async def main(tokens: int, repeat: int) -> None:
    tokenizer = load_tokenizer()
    adapter = Adapter(
        engine=MoEEngine(SimulatedEngine(tokenizer)),
        tokenizer=tokenizer,
        manager=TrajectoryManager(routing=SHAPE),
        config=AdapterConfig(routed_experts=True, admin_token=TOKEN),
    )
    rng = random.Random(0)
    text = " ".join(rng.choice(WORDS) for _ in range(tokens))
    runner, url = await start_server(adapter)
    try:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="long", max_retries=0)
        await client.messages.create(
            model="m", max_tokens=256, messages=[{"role": "user", "content": text}]
        )
        results = {}
        for fmt in FinishFormat:
            runs = [await asyncio.to_thread(fetch, url, str(fmt)) for _ in range(repeat)]
            results[fmt] = min(runs, key=lambda r: r[1])
    finally:
        await runner.cleanup()
    _, _, samples, rows = results[FinishFormat.JSON]
    print(
        f"/finish of one session: {samples} sample(s), {rows} tokens with routed experts "
        f"({SHAPE.layers} layers x top-{SHAPE.top_k}, simulated MoE engine), best of {repeat}"
    )
    json_bytes, json_s = results[FinishFormat.JSON][:2]
    print(f"{'format':<38}{'bytes':>10}{'client s':>10}{'bytes vs JSON':>15}{'faster':>8}")
    for fmt, (nbytes, seconds, _, _) in results.items():
        print(
            f"{fmt:<38}{nbytes / 1e6:>8.1f}MB{seconds:>10.2f}{nbytes / json_bytes:>15.2f}"
            f"{json_s / seconds:>7.1f}x"
        )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )


if __name__ == "__main__":
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=80_000)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(main(args.tokens, args.repeat))
