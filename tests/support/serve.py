"""`tokentrail serve` in a subprocess on a free loopback port, for the real-harness tests.

`serving(script_file, *extra_args)` starts it with the scripted engine and yields a `Served`
(base URL, finish a session) once `/healthz` answers; the process is stopped on exit. Any other
path answers a fast JSON 404, which is what harnesses probing for an Ollama or LM Studio server
need to see. It runs with `--verify-resume`: every request a real harness sends is translated
both resumed and in full, and `Served.resume_checks` says how many were the same.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tokentrail.adapter import Adapter, start_server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tokentrail serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("tokentrail serve did not come up")


# The admin token the served adapter is started with (admin routes are off without one).
ADMIN_TOKEN = "test-admin"


@dataclass
class Served:
    url: str
    proc: subprocess.Popen

    def finish(self, sid: str, reward: float = 1.0) -> dict[str, Any]:
        """Finish a session: its samples and ledger, as `/finish` answers."""
        req = urllib.request.Request(
            f"{self.url}/tokentrail/sessions/{sid}/finish",
            data=json.dumps({"reward": reward}).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def resume_checks(self) -> dict[str, float]:
        """How many requests `--verify-resume` found translated the same resumed and in full
        (`same`), and how many not (`mismatch`)."""
        return resume_checks(_get(f"{self.url}/metrics"))


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read().decode()


def resume_checks(metrics: str) -> dict[str, float]:
    """`tokentrail_resume_checks_total` by result, from a `/metrics` payload."""
    return {
        sample.labels["result"]: sample.value
        for family in text_string_to_metric_families(metrics)
        if family.name == "tokentrail_resume_checks"
        for sample in family.samples
        if sample.name == "tokentrail_resume_checks_total"
    }


@contextmanager
def serving(script: Path, *extra_args: str, engine: str | None = None) -> Iterator[Served]:
    """`engine` replaces the scripted one (`transformers:DIR+scripted:FILE` runs a real model
    teacher-forced on the script)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Its output goes to a file: a pipe nobody reads stops the server once it holds 64 KB.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokentrail", "serve", "--port", str(port),
             "--engine", engine or f"scripted:{script}", "--admin-token", ADMIN_TOKEN,
             "--verify-resume", *extra_args],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            try:
                wait_healthy(url, proc)
            except (RuntimeError, TimeoutError) as e:
                log.seek(0)
                tail = log.read()[-4000:].decode(errors="replace")
                raise type(e)(f"{e}; its output ends:\n{tail}") from None
            yield Served(url, proc)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@contextmanager
def serving_in_thread(adapter: Adapter) -> Iterator[tuple[str, asyncio.AbstractEventLoop]]:
    """An adapter built here (a test's own engine) on loopback, in a thread of its own while a
    CLI runs in this one: its base URL and the loop to run its coroutines on."""
    loop = asyncio.new_event_loop()
    started: dict = {}
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        started["runner"], started["url"] = loop.run_until_complete(start_server(adapter))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield started["url"], loop
    finally:
        asyncio.run_coroutine_threadsafe(started["runner"].cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
