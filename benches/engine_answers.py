"""A long first turn's engine answer with routed experts: peak memory and time to read it,
decode its rows and store them, this tree's path against the plain one.

A stand-in SGLang server (its own process, so its memory is not counted) answers `/generate`
for a 128K-token prompt with the routed experts of every position, base64 of int32 as SGLang
sends them, at Qwen3-30B-A3B's shape (48 layers x top-8 of 128) and at DeepSeek V3's (58 MoE
layers x top-8 of 256). A fresh client process per row reads the answer over loopback HTTP
and pushes the turn into a `TurnStore`:

- this tree: `SGLangEngine.generate` (the answer read to its end under the request's bound,
  parsed as text, rows decoded a slice at a time into the store's uint8, checked by blocks);
- plain: the same read, then `json.loads(bytes)`, `base64.b64decode`, int32 rows and checks
  over the whole array (main's decode, with its read fixed).

Peak is the client's VmHWM minus its RSS before the request; time is the request to the
stored turn.

    python benches/engine_answers.py [--tokens 131072]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import platform
import socket
import time
from typing import Any

import numpy as np

OUTPUT = [40, 1079, 151645]
SHAPES = {"Qwen3-30B-A3B 48x8/128": (48, 8, 128), "DeepSeek V3 58x8/256": (58, 8, 256)}


def prompt(n: int) -> list[int]:
    return ((np.arange(n, dtype=np.int64) * 7919 + 151) % 151_000).tolist()


def answer(tokens: int, dims: tuple[int, int, int]) -> bytes:
    """SGLang's `/generate` answer: ids, logprobs and the rows of every position fed forward."""
    layers, k, experts = dims
    fed = tokens + len(OUTPUT) - 1
    base = (np.arange(fed)[:, None] * 2654435761 + np.arange(layers)[None, :] * 40503) % experts
    rows = ((base[:, :, None] + np.arange(k)) % experts).astype("<i4")
    meta = {
        "id": "bench",
        "finish_reason": {"type": "stop", "matched": OUTPUT[-1]},
        "prompt_tokens": tokens,
        "completion_tokens": len(OUTPUT),
        "output_token_logprobs": [[-0.25, t, None] for t in OUTPUT],
        "routed_experts": base64.b64encode(rows.tobytes()).decode("ascii"),
    }
    return json.dumps({"text": "", "output_ids": OUTPUT, "meta_info": meta}).encode()


def serve(port: int, body: bytes, ready: Any) -> None:
    from aiohttp import web

    async def generate(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json")

    async def main() -> None:
        app = web.Application(client_max_size=1 << 30)
        app.add_routes([web.post("/generate", generate)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def client(path: str, url: str, tokens: int, dims: tuple[int, int, int], out: Any) -> None:
    from tokentrail import _core
    from tokentrail.core.routing import RoutingShape
    from tokentrail.engines import GenerateRequest, ReplayRequest, SamplingParams
    from tokentrail.engines.sglang import SGLangEngine

    shape = RoutingShape(*dims)
    ids = prompt(tokens)
    req = GenerateRequest(
        input_ids=ids,
        sampling=SamplingParams(max_new_tokens=64),
        session_id="bench",
        request_id="bench",
        replay=ReplayRequest(routed_start=0, routing=shape),
    )
    store = _core.TurnStore(routed_experts=shape.dims)
    engine = SGLangEngine(url)
    base = status_kb("VmRSS")
    start = time.perf_counter()
    if path == "this tree":
        generation = asyncio.run(_generate(engine, req))
        routed = generation.routed_experts.store_arg()
    else:
        routed = asyncio.run(_plain(engine, req, shape))
    store.push(-1, ids, OUTPUT, [-0.25] * len(OUTPUT), routed_experts=routed)
    elapsed = time.perf_counter() - start
    out.put((elapsed, (status_kb("VmHWM") - base) / 1024, store.nbytes() / 2**20))


async def _generate(engine: Any, req: Any) -> Any:
    try:
        return await engine.generate(req)
    finally:
        await engine.close()


async def _plain(engine: Any, req: Any, shape: Any) -> Any:
    from tokentrail.core.routing import checked_rows
    from tokentrail.engines.bound import answer_limit
    from tokentrail.engines.http import read_bounded
    from tokentrail.kinds import Replay

    session = engine._client()
    try:
        async with session.post(
            engine.base_url + "/generate", json=engine.request_body(req)
        ) as resp:
            raw = await read_bounded(resp, answer_limit(req))
    finally:
        await engine.close()
    data = json.loads(raw)
    del raw
    values = np.frombuffer(
        base64.b64decode(data["meta_info"]["routed_experts"], validate=True), "<i4"
    )
    del data
    rows = checked_rows(
        Replay.ROUTED_EXPERTS,
        values,
        start=0,
        prompt_tokens=len(req.input_ids),
        output_tokens=len(OUTPUT),
        shape=shape,
    )
    # The plain check: every row sorted at once.
    ordered = np.sort(rows.rows, axis=-1)
    assert not ((np.diff(ordered, axis=-1) == 0).any(axis=-1)).any()
    return rows.store_arg()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128 * 1024)
    args = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    print(f"first turn of {args.tokens} prompt tokens + {len(OUTPUT)} sampled, routed experts on")
    header = (
        f"{'shape':<24}{'answer MiB':>11}{'stored MiB':>11}"
        f"{'this: peak MiB':>15}{'plain: peak MiB':>16}{'ratio':>7}"
        f"{'this: s':>9}{'plain: s':>10}{'ratio':>7}"
    )
    print(header)
    for name, dims in SHAPES.items():
        body = answer(args.tokens, dims)
        port = free_port()
        ready = ctx.Event()
        server = ctx.Process(target=serve, args=(port, body, ready), daemon=True)
        server.start()
        ready.wait(60)
        results = {}
        for path in ("this tree", "plain"):
            out = ctx.Queue()
            proc = ctx.Process(
                target=client, args=(path, f"http://127.0.0.1:{port}", args.tokens, dims, out)
            )
            proc.start()
            results[path] = out.get(timeout=600)
            proc.join()
        server.terminate()
        server.join()
        (t_this, m_this, stored), (t_plain, m_plain, _) = results["this tree"], results["plain"]
        print(
            f"{name:<24}{len(body) / 2**20:>11.0f}{stored:>11.0f}"
            f"{m_this:>15.0f}{m_plain:>16.0f}{m_plain / m_this:>6.1f}x"
            f"{t_this:>9.2f}{t_plain:>10.2f}{t_plain / t_this:>6.1f}x"
        )
    load = os.getloadavg()[0]
    print(
        f"\nratio: plain / this tree. machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"load average {load:.1f} (timings under load are high), Python {platform.python_version()}"
    )


if __name__ == "__main__":
    main()
