"""Run the real Claude Code CLI interactively, in a pseudo-terminal, against a local Anthropic
Messages server: what a user typing `claude "<prompt>"` in a terminal gets, for the requests only
the interactive mode sends (its session-title request; see docs/harnesses/claude-code.md).

`run_claude_tty` starts `claude <prompt>` in a scratch HOME whose `.claude.json` has finished
onboarding and trusts `cwd` (the two dialogs a first start shows), with no `CLAUDE_CODE_*` switch
(`DISABLE_AUTOUPDATER` only) and no permission mode: a tool that needs a permission would wait
for a key, so a script for it uses tools that need none (Read in `cwd`). The CLI runs in a
process group of its own; the screen is read as it is drawn (a TUI whose terminal is not read
stops drawing), and once `done()` says the server saw what the test waits for, two Ctrl-C end
the session, as they do for a user.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import struct
import subprocess
import tempfile
import termios
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

# Only what the CLI needs to reach `base_url` and draw; nothing else of the caller's leaks in.
# And no self-update: an interactive start checks for a newer release and installs it, which on
# a machine with a network would download one (no gate of the title request reads the switch).
TTY_ENV = {"TERM": "xterm-256color", "LANG": "C.UTF-8", "DISABLE_AUTOUPDATER": "1"}
ROWS, COLUMNS = 40, 120
# Ctrl-C twice exits; a TUI busy drawing may miss one, so it is repeated until the CLI is gone.
CTRL_C, CTRL_C_EVERY, EXIT_WAIT = b"\x03", 0.3, 10.0


@dataclass
class TtyRun:
    """How one interactive session ended: its exit status (negative: killed by that signal),
    whether it left on Ctrl-C, and what it drew (escape sequences and all)."""

    returncode: int
    exited_on_ctrl_c: bool
    screen: bytes


def run_claude_tty(
    exe: Path,
    prompt: str,
    *,
    base_url: str,
    session_id: str,
    cwd: Path,
    done: Callable[[], bool],
    timeout: float = 60,
    model: str = "test-model",
    env: Mapping[str, str] | None = None,
) -> TtyRun:
    """Run `claude --model <model> <prompt>` in `cwd` until `done()` is true, then leave it with
    Ctrl-C. Raises TimeoutError, after killing the CLI and anything it started, when `done()`
    is still false after `timeout` seconds."""
    with tempfile.TemporaryDirectory(prefix="claude-tty-home-") as home:
        settings = {
            "hasCompletedOnboarding": True,
            "projects": {str(cwd): {"hasTrustDialogAccepted": True}},
        }
        (Path(home) / ".claude.json").write_text(json.dumps(settings))
        full_env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": home,
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_AUTH_TOKEN": session_id,
            **TTY_ENV,
            **(env or {}),
        }
        primary, secondary = os.openpty()
        _set_size(secondary)
        proc = subprocess.Popen(
            [str(exe), "--model", model, prompt], cwd=cwd, env=full_env,
            stdin=secondary, stdout=secondary, stderr=secondary, start_new_session=True,
        )  # fmt: skip
        os.close(secondary)
        screen = bytearray()
        try:
            deadline = time.monotonic() + timeout
            while not done():
                if time.monotonic() > deadline or not _read(primary, screen, 0.2):
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    raise TimeoutError(
                        f"claude (interactive) did not get there within {timeout}s "
                        f"(exit {proc.returncode}); screen tail: {_tail(screen)!r}"
                    )
            exited = _leave(proc, primary, screen)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            os.close(primary)
    return TtyRun(proc.returncode, exited, bytes(screen))


def _set_size(fd: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))


def _read(fd: int, screen: bytearray, wait: float) -> bool:
    """Read what the CLI drew within `wait` seconds; False once its side of the terminal closed."""
    ready, _, _ = select.select([fd], [], [], wait)
    if not ready:
        return True
    try:
        data = os.read(fd, 1 << 16)
    except OSError:  # EIO: every process holding the terminal is gone
        return False
    screen += data
    return bool(data)


def _leave(proc: subprocess.Popen, fd: int, screen: bytearray) -> bool:
    """Ctrl-C until the CLI exits (True), or EXIT_WAIT seconds (False; the caller kills it)."""
    deadline = time.monotonic() + EXIT_WAIT
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            os.write(fd, CTRL_C)
        except OSError:
            break
        end = time.monotonic() + CTRL_C_EVERY
        while time.monotonic() < end and _read(fd, screen, CTRL_C_EVERY):
            pass
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


def _tail(screen: bytearray) -> str:
    return screen[-2000:].decode("utf-8", "replace")
