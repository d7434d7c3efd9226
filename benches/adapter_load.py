"""Adapter throughput under concurrent sessions: a `tokentrail serve` process, and a client in a
process of its own sending pre-serialized request bodies.

One Claude-Code-style session (scripted engine, Claude Code's tool list, tool results padded so
the context grows to `--context` tokens over `--turns` turns) is recorded once; the client then
replays its bodies for `--sessions` sessions at once (each under its own API key), every session
sending its next request as soon as the previous reply arrives. The scripted engine reproduces
the recorded outputs, so every replayed turn is the turn the bodies expect.

Reported: turns per second over the whole run, the client's latency per request (p50/p99), and
from the server's own `/metrics` the time its stages took, with the scripted engine's share
apart (it tokenizes its reply; a real engine's cost is elsewhere).

    python benches/adapter_load.py [--sessions 32] [--turns 32] [--context 16384]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from sessions import claude_code_tools

TASK = "Refactor the package: read, edit and test every module."
ADMIN = "bench-admin"


def long_script(turns: int) -> list[list[dict[str, Any]]]:
    """`turns - 1` tool calls cycling Read/Edit/Write/Bash, then a final answer."""
    replies: list[list[dict[str, Any]]] = []
    for k in range(turns - 1):
        path = f"mod{k % 4}.py"
        kind = k % 4
        if kind == 0:
            call = {"name": "Read", "input": {"file_path": path}}
        elif kind == 1:
            edit = {"file_path": path, "old_string": "x = 0", "new_string": f"x = 0\n# step {k}   "}
            call = {"name": "Edit", "input": edit}
        elif kind == 2:
            body = "".join(f"def f{j}(a):   \n    return a + {j}\n" for j in range(8))
            call = {"name": "Write", "input": {"file_path": path, "content": body}}
        else:
            command = {"command": f"pytest -q tests/test_{k}.py", "description": "run tests"}
            call = {"name": "Bash", "input": command}
        replies.append(
            [
                {"type": "thinking", "thinking": f"Step {k}: working on {path} carefully."},
                {"type": "text", "text": f"Now step {k}."},
                {"type": "tool_use", **call},
            ]
        )
    replies.append([{"type": "text", "text": "All modules refactored and tested."}])
    return replies


def record_bodies(script: list, turns: int, context: int) -> list[bytes]:
    """The bodies one session sends, recorded against an in-process adapter."""
    from aiohttp import web

    from tokentrail.adapter import Adapter, start_server
    from tokentrail.engines.scripted import ScriptedEngine
    from tokentrail.sim.harness import HarnessSim, Workspace
    from tokentrail.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    bodies: list[bytes] = []

    @web.middleware
    async def capture(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST" and request.path == "/v1/messages":
            bodies.append(await request.read())
        return await handler(request)

    async def run() -> None:
        adapter = Adapter(engine=ScriptedEngine(tokenizer, script), tokenizer=tokenizer)
        adapter.app.middlewares.insert(0, capture)
        runner, url = await start_server(adapter)
        try:
            files = {f"mod{j}.py": "x = 0\n" for j in range(4)}
            # Results padded so the prompt reaches about `context` tokens (~2 characters each).
            workspace = Workspace(files, result_chars=max(0, 2 * context // turns - 200))
            tools, _ = claude_code_tools()
            sim = HarnessSim(url, "rec", workspace=workspace, tools=tools, max_requests=turns)
            await sim.run(TASK)
        finally:
            await runner.cleanup()

    asyncio.run(run())
    return bodies


# -- the client, in its own process --------------------------------------------------------------


async def client(url: str, bodies: list[bytes], sessions: int) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []

    async def session(http: aiohttp.ClientSession, sid: str) -> None:
        headers = {
            "Authorization": f"Bearer {sid}",
            "Content-Type": "application/json",
            "anthropic-version": "2023-06-01",
        }
        for body in bodies:
            start = time.perf_counter()
            async with http.post(f"{url}/v1/messages", data=body, headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{sid}: HTTP {resp.status}")
            latencies.append(time.perf_counter() - start)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        start = time.perf_counter()
        await asyncio.gather(*(session(http, f"load-{i}") for i in range(sessions)))
        elapsed = time.perf_counter() - start
    ms = np.array(latencies) * 1e3
    return {
        "turns": len(latencies),
        "elapsed": elapsed,
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
    }


def _client_main(url: str, bodies_file: str, sessions: int) -> None:
    bodies = [bytes.fromhex(h) for h in json.loads(Path(bodies_file).read_text())]
    start = time.process_time()
    result = asyncio.run(client(url, bodies, sessions))
    print(json.dumps({**result, "cpu_s": time.process_time() - start}))


# -- the orchestration ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("tokentrail serve exited")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("tokentrail serve did not come up")


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used (Linux `/proc`)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stage_seconds(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("tokentrail_stage_duration_seconds_sum{"):
            stage = line.split('stage="', 1)[1].split('"', 1)[0]
            out[stage] = float(line.rsplit(" ", 1)[1])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=32)
    parser.add_argument("--context", type=int, default=16_384)
    parser.add_argument("--backend", default="rust", choices=["rust", "python"])
    parser.add_argument("--workers", type=int, default=None, help="the server's --workers")
    parser.add_argument("--client", nargs=2, metavar=("URL", "BODIES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        _client_main(args.client[0], args.client[1], args.sessions)
        return 0
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    script = long_script(args.turns)
    bodies = record_bodies(script, args.turns, args.context)
    with tempfile.TemporaryDirectory() as tmp:
        script_file, bodies_file = Path(tmp) / "script.json", Path(tmp) / "bodies.json"
        script_file.write_text(json.dumps(script))
        bodies_file.write_text(json.dumps([b.hex() for b in bodies]))
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "TOKENTRAIL_BACKEND": args.backend}
        server = subprocess.Popen(
            [sys.executable, "-m", "tokentrail", "serve", "--port", str(port),
             "--engine", f"scripted:{script_file}", "--admin-token", ADMIN,
             *([] if args.workers is None else ["--workers", str(args.workers)])],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _wait(url, server)
            cpu_before = cpu_seconds(server.pid)
            out = subprocess.run(
                [sys.executable, __file__, "--sessions", str(args.sessions),
                 "--client", url, str(bodies_file)],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            result = json.loads(out)
            server_cpu = cpu_seconds(server.pid) - cpu_before
            stages = stage_seconds(url)
        finally:
            server.terminate()
            server.wait(30)
    engine = stages.pop("engine", 0.0)
    adapter = sum(stages.values())
    turns = result["turns"]
    last_kb = len(bodies[-1]) / 1e3
    print(
        f"adapter load: {args.sessions} concurrent sessions x {len(bodies)} turns, last body "
        f"{last_kb:.0f} KB; server `tokentrail serve` ({args.backend} core), client in its own "
        "process"
    )
    print(f"{'turns':>7}{'turns/s':>10}{'client p50 ms':>15}{'p99 ms':>9}"
          f"{'server CPU ms/turn':>20}{'client CPU ms/turn':>20}")  # fmt: skip
    print(
        f"{turns:>7}{turns / result['elapsed']:>10.0f}{result['p50']:>15.2f}{result['p99']:>9.2f}"
        f"{server_cpu * 1e3 / turns:>20.2f}{result['cpu_s'] * 1e3 / turns:>20.2f}"
    )
    print(
        f"server stage time per turn (wall, queueing included): adapter {adapter * 1e3 / turns:.2f}"
        f" ms, scripted engine {engine * 1e3 / turns:.2f} ms; one process at the server's CPU "
        f"per turn would serve at most {turns / server_cpu:.0f} turns/s"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores (server and client share them), "
        f"{platform.python_implementation()} {platform.python_version()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
