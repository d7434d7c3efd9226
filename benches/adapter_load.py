"""Adapter throughput and overhead under concurrent sessions, scripted engine.

Concurrent Claude-Code-style sessions (default 8 x 32 turns) drive one adapter over loopback
HTTP. Reported: requests per second, and the adapter's own time per request (every stage but the
engine's) at p50/p99, for the Rust core and the pure-Python reference backend.

    python benches/adapter_load.py [--sessions 8] [--turns 32]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import time
from typing import Any

import aiohttp
import numpy as np

from tokentrail.adapter.server import Adapter, start_server
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.sim.harness import HarnessSim, Workspace
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.manager import TrajectoryManager

TASK = "Refactor the package: read, edit and test every module."


def long_script(turns: int) -> list[list[dict[str, Any]]]:
    """`turns - 1` tool calls cycling Read/Edit/Write/Bash, then a final answer."""
    replies: list[list[dict[str, Any]]] = []
    for k in range(turns - 1):
        path = f"mod{k % 4}.py"
        kind = k % 4
        if kind == 0:
            call = {"name": "Read", "input": {"file_path": path}}
        elif kind == 1:
            call = {
                "name": "Edit",
                "input": {
                    "file_path": path,
                    "old_string": "x = 0",
                    "new_string": f"x = 0\n# step {k}   ",
                },
            }
        elif kind == 2:
            body = "".join(f"def f{j}(a):   \n    return a + {j}\n" for j in range(8))
            call = {"name": "Write", "input": {"file_path": path, "content": body}}
        else:
            call = {
                "name": "Bash",
                "input": {"command": f"pytest -q tests/test_{k}.py", "description": "run tests"},
            }
        replies.append(
            [
                {"type": "thinking", "thinking": f"Step {k}: working on {path} carefully."},
                {"type": "text", "text": f"Now step {k}."},
                {"type": "tool_use", **call},
            ]
        )
    replies.append([{"type": "text", "text": "All modules refactored and tested."}])
    return replies


async def run(backend: str, sessions: int, turns: int, tokenizer: Any) -> dict[str, float]:
    manager = TrajectoryManager(backend=backend)
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer, long_script(turns)), tokenizer=tokenizer, manager=manager
    )
    files = {f"mod{j}.py": "x = 0\n" for j in range(4)}
    runner, url = await start_server(adapter)
    try:
        connector = aiohttp.TCPConnector(limit=sessions * 2)
        async with aiohttp.ClientSession(connector=connector) as http:
            sims = [
                HarnessSim(url, f"s{i}", workspace=Workspace(dict(files)), max_requests=turns)
                for i in range(sessions)
            ]
            start = time.perf_counter()
            results = await asyncio.gather(*(sim.run(TASK, http) for sim in sims))
            elapsed = time.perf_counter() - start
        t0 = time.perf_counter()
        for i in range(sessions):
            await adapter.finish_trajectory(f"s{i}")
        finish_s = time.perf_counter() - t0
    finally:
        await runner.cleanup()
    requests = sum(r.requests for r in results)
    overhead = np.array([t.overhead for t in adapter.timings]) * 1e3
    return {
        "requests": requests,
        "rps": requests / elapsed,
        "p50": float(np.percentile(overhead, 50)),
        "p99": float(np.percentile(overhead, 99)),
        "finish_ms": finish_s * 1e3 / sessions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=32)
    args = parser.parse_args()
    tokenizer = load_tokenizer()
    rows = {
        b: asyncio.run(run(b, args.sessions, args.turns, tokenizer)) for b in ("rust", "python")
    }
    print(
        f"adapter load: {args.sessions} concurrent sessions x {args.turns} turns, scripted engine"
    )
    print(
        f"{'backend':<10}{'requests':>9}{'req/s':>9}{'overhead p50 ms':>17}{'p99 ms':>9}"
        f"{'finish ms/session':>19}"
    )
    for name, r in rows.items():
        print(
            f"{name:<10}{r['requests']:>9}{r['rps']:>9.1f}{r['p50']:>17.2f}{r['p99']:>9.2f}"
            f"{r['finish_ms']:>19.2f}"
        )
    rust, py = rows["rust"], rows["python"]
    print(
        f"{'ratio':<10}{'':>9}{rust['rps'] / py['rps']:>8.2f}x{py['p50'] / rust['p50']:>16.2f}x"
        f"{py['p99'] / rust['p99']:>8.2f}x{py['finish_ms'] / rust['finish_ms']:>18.2f}x"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )


if __name__ == "__main__":
    # The per-session lost-signal warnings would interleave with the table.
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    main()
