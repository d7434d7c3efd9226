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
        [--servers rust:2,rust:0,python:2] [--rounds 2]
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


def serve_once(
    script_file: Path, bodies_file: Path, sessions: int, backend: str, workers: int | None
) -> dict[str, float]:
    """One `tokentrail serve` run of the bodies: turns, elapsed, client p50/p99 and CPU, the
    server's CPU and its stage times (s)."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TOKENTRAIL_BACKEND": backend}
    server = subprocess.Popen(
        [sys.executable, "-m", "tokentrail", "serve", "--port", str(port),
         "--engine", f"scripted:{script_file}", "--admin-token", ADMIN,
         *([] if workers is None else ["--workers", str(workers)])],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait(url, server)
        cpu_before = cpu_seconds(server.pid)
        out = subprocess.run(
            [sys.executable, __file__, "--sessions", str(sessions),
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
    return {**result, "server_cpu": server_cpu, "engine": engine, "adapter": sum(stages.values())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=32)
    parser.add_argument("--context", type=int, default=16_384)
    parser.add_argument(
        "--servers",
        default="rust:2,rust:0,python:2",
        help="the servers compared, BACKEND:WORKERS each (default: the Rust core with its "
        "default 2 workers and with --workers 0, and the Python reference core)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs of every server, in turn")
    parser.add_argument("--client", nargs=2, metavar=("URL", "BODIES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        _client_main(args.client[0], args.client[1], args.sessions)
        return 0
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    servers = [(b, int(w)) for b, w in (item.split(":") for item in args.servers.split(","))]
    script = long_script(args.turns)
    bodies = record_bodies(script, args.turns, args.context)
    runs: list[tuple[str, int, int, dict[str, float], float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        script_file, bodies_file = Path(tmp) / "script.json", Path(tmp) / "bodies.json"
        script_file.write_text(json.dumps(script))
        bodies_file.write_text(json.dumps([b.hex() for b in bodies]))
        # Every server once per round, round after round: the machine's load meets them alike.
        for round_ in range(1, args.rounds + 1):
            for backend, workers in servers:
                result = serve_once(script_file, bodies_file, args.sessions, backend, workers)
                runs.append((backend, workers, round_, result, os.getloadavg()[0]))
    print(
        f"adapter load: {args.sessions} concurrent sessions x {len(bodies)} turns, last body "
        f"{len(bodies[-1]) / 1e3:.0f} KB; server `tokentrail serve`, client in its own process; "
        f"{args.rounds} rounds, each running every server once"
    )
    print(f"{'core':<8}{'workers':>8}{'round':>6}{'turns/s':>9}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'server CPU ms/turn':>20}{'client CPU ms/turn':>20}{'engine ms':>10}"
          f"{'load':>6}")  # fmt: skip
    for backend, workers, round_, r, load in runs:
        turns = r["turns"]
        print(
            f"{backend:<8}{workers:>8}{round_:>6}{turns / r['elapsed']:>9.0f}{r['p50']:>8.2f}"
            f"{r['p99']:>8.2f}{r['server_cpu'] * 1e3 / turns:>20.2f}"
            f"{r['cpu_s'] * 1e3 / turns:>20.2f}{r['engine'] * 1e3 / turns:>10.2f}{load:>6.1f}"
        )
    print("medians over the rounds (server CPU per turn, and against the first server's):")
    base = None
    for backend, workers in servers:
        mine = [r for b, w, _, r, _ in runs if (b, w) == (backend, workers)]
        cpu = float(np.median([r["server_cpu"] * 1e3 / r["turns"] for r in mine]))
        rate = float(np.median([r["turns"] / r["elapsed"] for r in mine]))
        base = cpu if base is None else base
        print(
            f"  {backend} core, --workers {workers}: {cpu:.2f} ms/turn ({cpu - base:+.2f} ms, "
            f"{cpu / base:.2f}x), {rate:.0f} turns/s"
        )
    print(
        "engine ms: the scripted engine's stage time per turn (wall, queueing included; it "
        "encodes and scores its reply, which a real engine does elsewhere); load: the load "
        "average after the run"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores (server and client share them), "
        f"{platform.python_implementation()} {platform.python_version()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
