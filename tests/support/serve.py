"""`tokentrail serve` in a subprocess on a free loopback port, for the real-harness tests.

`serving(script_file, *extra_args)` starts it with the scripted engine and yields a `Served`
(base URL, finish a session) once `/healthz` answers; the process is stopped on exit. Any other
path answers a fast JSON 404, which is what harnesses probing for an Ollama or LM Studio server
need to see.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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


@contextmanager
def serving(script: Path, *extra_args: str, engine: str | None = None) -> Iterator[Served]:
    """`engine` replaces the scripted one (`transformers:DIR+scripted:FILE` runs a real model
    teacher-forced on the script)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokentrail", "serve", "--port", str(port),
         "--engine", engine or f"scripted:{script}", "--admin-token", ADMIN_TOKEN, *extra_args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_healthy(url, proc)
        yield Served(url, proc)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
