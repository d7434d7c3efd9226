"""Run a harness CLI headless: its own process group (so a timeout also kills the shells its
tools started), no stdin, stdout and stderr captured, and an environment of only what the
caller passes (a developer's API keys or proxy settings never reach it)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str


def run_headless(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float, what: str
) -> Finished:
    """Run `argv` to its end; raise TimeoutError, after killing its process group, when it
    outlasts `timeout` seconds. `what` names it in that error."""
    full_env = {"PATH": os.environ.get("PATH", os.defpath), **env}
    proc = subprocess.Popen(
        list(argv), cwd=cwd, env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise TimeoutError(
            f"{what} did not finish within {timeout}s (killed); "
            f"stderr tail: {stderr[-2000:]!r}; stdout tail: {stdout[-2000:]!r}"
        ) from None
    return Finished(proc.returncode, stdout, stderr)
