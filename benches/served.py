"""A `tokentrail serve` process for the benchmarks that measure the server from outside: its
own interpreter (so the load generator never shares its GIL), started from a chosen source tree
(`--before` runs an older checkout for comparison), its RSS read from /proc.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO_PYTHON = Path(__file__).resolve().parent.parent / "python"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """`python -m tokentrail serve ARGS` from `python_dir`, on a free port."""

    def __init__(
        self, args: list[str], python_dir: Path | str | None = None, fd_limit: int = 0
    ) -> None:
        self.fd_limit = fd_limit
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["serve", "--port", str(self.port), *args]
        self.python_dir = str(python_dir or REPO_PYTHON)
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Served:
        env = {**os.environ, "PYTHONPATH": self.python_dir}
        # A file, not a pipe: a server logging tracebacks into a pipe nobody reads would block
        # on the write once the pipe is full.
        self.log = tempfile.NamedTemporaryFile(prefix="tokentrail-serve-", suffix=".log")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tokentrail", *self.args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            preexec_fn=self._limit_fds if self.fd_limit else None,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2):
                    return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(Path(self.log.name).read_text()) from None
                time.sleep(0.2)
        raise RuntimeError("tokentrail serve did not come up")

    def _limit_fds(self) -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.fd_limit, self.fd_limit))

    def logged(self, needle: str) -> int:
        """How many lines of the server's log hold `needle` (tracebacks: "Traceback")."""
        return sum(needle in line for line in Path(self.log.name).read_text().splitlines())

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def rss_mb(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
