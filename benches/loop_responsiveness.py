"""Does the server stay responsive while it works? `/healthz` latency under a heavy load.

The load: 32 sessions whose first prompt is ~64K tokens, each taking 4 turns, all at once, and
a 20 MB and a 12 MB count_tokens request sent while they run. A prober in a process of its own
asks `/healthz` every 20 ms throughout and reports its latency. Each configuration serves from
its own `tokentrail serve` process (scripted engine):

- before: an older source tree (`--before DIR`, a checkout's `python/` folder), every step on
  the event loop;
- inline: this tree with `--workers 0` (steps on the loop, the new limits and checks);
- after: this tree's defaults (steps in worker threads; the 20 MB count is under the default
  `--max-body-bytes`, 32 MiB, and processed);
- after, 16 MiB bodies: the same, with the 20 MB count refused (413) before it is read.

    python benches/loop_responsiveness.py [--before /path/to/old/python] [--sessions 32]

`--images` measures instead the two targets of images and slow readers (issue 44), each
before (`--before`) and after:

- four 20 MB PNG requests at once (Qwen3-VL, each image decoded, checked and sized), three
  rounds: `/healthz` p99 < 50 ms;
- 40 clients that ask for a ~730 KB stream each and never read it: `/healthz` p99 < 50 ms
  (the engine, the tests' SGLang stand-in, in a process of its own, as a real engine is).

    python benches/loop_responsiveness.py --images [--before /path/to/old/python]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import random
import socket
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from served import Served  # noqa: E402

# The target for both `--images` rows.
TARGET_P99_MS = 50

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "zi", "pe", "su", "do", "fa"]


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(
        "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n)
    )


def probe(url: str, stop: Any, out: Any) -> None:
    """In a process of its own: GET /healthz every 20 ms until `stop` is set; the latencies
    (ms, inf for a failed probe) go to `out`."""

    async def run() -> list[float]:
        latencies = []
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while not stop.is_set():
                start = time.perf_counter()
                try:
                    async with http.get(f"{url}/healthz") as resp:
                        await resp.read()
                    latencies.append((time.perf_counter() - start) * 1e3)
                except (aiohttp.ClientError, TimeoutError):
                    latencies.append(float("inf"))
                await asyncio.sleep(0.02)
        return latencies

    out.put(asyncio.run(run()))


async def session(http: aiohttp.ClientSession, url: str, sid: str, text: str, turns: int) -> int:
    messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
    done = 0
    for _ in range(turns):
        body = {"model": "m", "max_tokens": 256, "messages": messages}
        headers = {"Authorization": f"Bearer {sid}", "Content-Type": "application/json"}
        async with http.post(f"{url}/v1/messages", data=json.dumps(body), headers=headers) as r:
            reply = await r.json(content_type=None)
            if r.status != 200:
                return done
        messages = [
            *messages,
            {"role": "assistant", "content": reply["content"]},
            {"role": "user", "content": f"go on ({done})"},
        ]
        calls = [b for b in reply["content"] if b["type"] == "tool_use"]
        if calls:
            messages[-1] = {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": c["id"], "content": "ok"} for c in calls
                ],
            }
        done += 1
    return done


def count_body(megabytes: int) -> bytes:
    """A count_tokens body of `megabytes` MB (10**6 bytes) of words."""
    chunk = words(200_000, seed=megabytes) + " "
    text = (chunk * (megabytes * 10**6 // len(chunk) + 1))[: megabytes * 10**6 - 60]
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()


async def count(http: aiohttp.ClientSession, url: str, data: bytes) -> str:
    headers = {"Authorization": "Bearer counter", "Content-Type": "application/json"}
    start = time.perf_counter()
    async with http.post(f"{url}/v1/messages/count_tokens", data=data, headers=headers) as r:
        await r.read()
        return f"{len(data) / 1e6:.0f} MB -> {r.status} in {time.perf_counter() - start:.1f} s"


async def load(url: str, sessions: int, turns: int, context_words: int) -> dict[str, Any]:
    texts = [words(context_words, seed=k) for k in range(sessions)]
    bodies = [count_body(mb) for mb in (20, 12)]
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        start = time.perf_counter()
        runs = [
            asyncio.create_task(session(http, url, f"s{k}", texts[k], turns))
            for k in range(sessions)
        ]
        await asyncio.sleep(1.0)
        counts = [asyncio.create_task(count(http, url, data)) for data in bodies]
        done = sum(await asyncio.gather(*runs))
        counted = await asyncio.gather(*counts)
        elapsed = time.perf_counter() - start
    return {"turns": done, "elapsed": elapsed, "counts": counted}


def noise_png(megabytes: int, seed: int) -> bytes:
    """A noise PNG of about `megabytes` MB (noise does not compress: a screenshot's worst)."""
    import io

    from PIL import Image

    side = int((megabytes * 10**6 / 3) ** 0.5)
    pixels = np.random.default_rng(seed).integers(0, 255, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def image_body(png: bytes) -> bytes:
    import base64

    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png).decode()}
    content = [{"type": "text", "text": "What is in it?"}, {"type": "image", "source": source}]
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": content}]}
    return json.dumps(body).encode()


async def images(url: str, bodies: list[bytes], rounds: int) -> dict[str, Any]:
    """`len(bodies)` image requests at once, `rounds` times; their statuses."""
    timeout = aiohttp.ClientTimeout(total=900)
    statuses: list[int] = []
    async with aiohttp.ClientSession(timeout=timeout) as http:
        start = time.perf_counter()
        for r in range(rounds):

            async def one(k: int, data: bytes, r: int = r) -> int:
                headers = {"Authorization": f"Bearer img-{r}-{k}"}
                headers["Content-Type"] = "application/json"
                async with http.post(f"{url}/v1/messages", data=data, headers=headers) as resp:
                    await resp.read()
                    return resp.status

            statuses += await asyncio.gather(*(one(k, b) for k, b in enumerate(bodies)))
        elapsed = time.perf_counter() - start
    return {"turns": len(statuses), "elapsed": elapsed, "counts": sorted(set(statuses))}


async def non_readers(url: str, clients: int, hold_s: float) -> dict[str, Any]:
    """`clients` raw connections that each ask for a long stream and never read a byte of it,
    held open `hold_s`; then one client that reads a stream whole (its size)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(
        {"model": "m", "max_tokens": 200_000, "stream": True,
         "messages": [{"role": "user", "content": "Write it all out."}]}
    ).encode()  # fmt: skip

    def request(k: int, close: bool = False) -> bytes:
        return (
            f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer slow-{k}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{'Connection: close' if close else 'X-Keep: 1'}\r\n\r\n"
        ).encode() + body

    writers = []
    start = time.perf_counter()
    for k in range(clients):
        _, writer = await asyncio.open_connection(host, int(port))
        # The smallest receive buffer: the server meets a full socket at once.
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        writer.write(request(k))
        writers.append(writer)
    await asyncio.sleep(hold_s)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request(clients, close=True))
    size = len(await asyncio.wait_for(reader.read(), 300))
    for w in [*writers, writer]:
        w.close()
    elapsed = time.perf_counter() - start
    return {"turns": clients, "elapsed": elapsed, "counts": [f"stream {size / 1e3:.0f} KB"]}


def run_config(name: str, args: list[str], python_dir: Path | None, opts: Any) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    with Served(["--engine", "scripted", *args], python_dir) as served:
        spawn = multiprocessing.get_context("spawn")
        queue: Any = spawn.Queue()
        stop = spawn.Event()
        prober = spawn.Process(target=probe, args=(served.url, stop, queue))
        prober.start()
        time.sleep(1.0)  # probes of the idle server first
        if opts.scenario == "images":
            result = asyncio.run(images(served.url, opts.bodies, opts.rounds))
        elif opts.scenario == "non-readers":
            result = asyncio.run(non_readers(served.url, opts.clients, opts.hold_s))
        else:
            result = asyncio.run(load(served.url, opts.sessions, opts.turns, opts.context_words))
        stop.set()
        latencies = np.array(queue.get())
        prober.join()
        result["rss_mb"] = served.rss_mb()
    finite = latencies[np.isfinite(latencies)]
    result.update(
        name=name,
        probes=len(latencies),
        failed=int((~np.isfinite(latencies)).sum()),
        p50=float(np.percentile(finite, 50)),
        p99=float(np.percentile(finite, 99)),
        max=float(finite.max()),
        load=f"{load_before:.1f} -> {os.getloadavg()[0]:.1f}",
    )
    return result


def engine_process(words_n: int, urls: Any) -> None:
    """In a process of its own, as a real engine is: the tests' SGLang stand-in, answering
    every request with `words_n` words (Qwen3 ids)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from support.fake_engines import IM_END, FakeSGLang
    from tokentrail.text.tokenizer import load_tokenizer

    ids = [*load_tokenizer("builtin:qwen3").encode(words(words_n, seed=7)), IM_END]
    logprobs = [-0.1] * len(ids)

    async def serve() -> None:
        async with FakeSGLang(lambda _prompt: (list(ids), list(logprobs), "stop")) as srv:
            urls.put(srv.url.removeprefix("http://"))
            await asyncio.Event().wait()

    asyncio.run(serve())


def image_configs(opts: Any) -> list[tuple[str, str, list[str], Path | None]]:
    """(scenario, name, serve args, tree) of the two image and slow-reader targets."""
    trees: list[tuple[str, Path | None]] = [("after", None)]
    if opts.before is not None:
        trees.insert(0, ("before", opts.before))
    vl = ["--tokenizer", "builtin:qwen3-vl", "--max-body-bytes", str(64 * 1024 * 1024)]
    script = ["--engine", f"sglang://{opts.engine_url}"]
    out = []
    for label, tree in trees:
        out.append(("images", f"{label}: four 20 MB PNGs at once", vl, tree))
        out.append(("non-readers", f"{label}: {opts.clients} clients not reading", script, tree))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", type=Path, default=None, help="an older tree's python/ dir")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--context-words", type=int, default=32_000, help="~2 tokens each")
    parser.add_argument("--quick", action="store_true", help="4 sessions, 2 turns, 4K words")
    parser.add_argument("--images", action="store_true", help="the image and slow-reader rows")
    parser.add_argument("--rounds", type=int, default=3, help="--images: rounds of four")
    parser.add_argument("--clients", type=int, default=40, help="--images: non-reading clients")
    parser.add_argument("--hold-s", type=float, default=10.0, help="--images: how long they hold")
    parser.add_argument("--stream-words", type=int, default=60_000, help="--images: reply words")
    opts = parser.parse_args()
    if opts.quick:
        opts.sessions, opts.turns, opts.context_words = 4, 2, 4000
    configs: list[tuple[str, str, list[str], Path | None]] = []
    engine = None
    if opts.images:
        opts.bodies = [image_body(noise_png(20, seed=k)) for k in range(4)]
        spawn = multiprocessing.get_context("spawn")
        urls: Any = spawn.Queue()
        engine = spawn.Process(target=engine_process, args=(opts.stream_words, urls), daemon=True)
        engine.start()
        opts.engine_url = urls.get(timeout=120)
        configs = image_configs(opts)
    else:
        if opts.before is not None:
            configs.append(("load", "before (--before tree)", [], opts.before))
        configs += [
            ("load", "inline (--workers 0)", ["--workers", "0"], None),
            ("load", "after (defaults)", [], None),
            ("load", "after, --max-body-bytes 16 MiB", ["--max-body-bytes", str(16 * 2**20)], None),
        ]
    rows = []
    for scenario, name, args, tree in configs:
        opts.scenario = scenario
        row = run_config(name, args, tree, opts)
        rows.append(row)
        print(
            f"{name}: {row['turns']} requests in {row['elapsed']:.1f} s; {row['counts']}",
            flush=True,
        )
    if engine is not None:
        engine.terminate()
    print()
    if opts.images:
        print(
            f"four 20 MB PNG requests at once x {opts.rounds} (Qwen3-VL); {opts.clients} clients "
            f"that never read a streamed reply, held {opts.hold_s:g} s; /healthz every 20 ms; "
            "target p99 < 50 ms"
        )
    else:
        print(
            f"{opts.sessions} sessions x {opts.turns} turns at ~{2 * opts.context_words // 1000}K "
            "tokens, plus 20 MB and 12 MB count_tokens; /healthz every 20 ms"
        )
    target = "| target p99 | met " if opts.images else ""
    print(
        f"| server | healthz p50 | p99 | max {target}| probes (failed) | requests | load time "
        "| load average (1 min), start -> end |"
    )
    print("|---|---|---|---|" + ("---|---|" if opts.images else "") + "---|---|---|---|")
    for r in rows:
        met = f"| < {TARGET_P99_MS} ms | {'yes' if r['p99'] < TARGET_P99_MS else 'no'} " * (
            opts.images
        )
        print(
            f"| {r['name']} | {r['p50']:.1f} ms | {r['p99']:.1f} ms | {r['max']:.0f} ms {met}| "
            f"{r['probes']} ({r['failed']}) | {r['turns']} | {r['elapsed']:.1f} s | {r['load']} |"
        )
    print(
        f"\nmachine: {platform.machine()}, {multiprocessing.cpu_count()} cores, "
        f"CPython {platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the end "
        "(shared with other work)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
