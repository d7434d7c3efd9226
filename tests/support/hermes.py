"""Run the real hermes-agent CLI headless against a local OpenAI Chat Completions server.

`install_hermes` pip-installs the pinned release once into a virtual environment of its own
under the test cache (hermes-agent puts generic top-level modules such as `agent`, `tools` and
`utils` into site-packages, so it never shares an environment with tokentrail). `Hermes` is one
agent home (`$HERMES_HOME`) configured for a custom endpoint with no network besides it: no
update check, model-metadata lookup, security-scanner download, LSP install or lazy pip
install. `Hermes.chat` runs `hermes chat -Q --yolo [-resume ID] -q PROMPT` and returns the
session id it printed. The API key (the tokentrail session id) goes on every request; the
hermes session id never reaches the server.
"""

from __future__ import annotations

import fcntl
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from support.harness_versions import LATEST
from support.headless import run_headless
from support.npm import default_cache_dir

HERMES_VERSION = LATEST["hermes-agent"].version
PACKAGE = LATEST["hermes-agent"].package

CONFIG = """\
model:
  provider: custom
  base_url: {base_url}/v1
  api_key: {api_key}
  default: qwen3
  # Known, so hermes does not look the model up on openrouter.ai (it must be >= 64000).
  context_length: 131072
agent:
  verify_on_stop: {verify_on_stop}
lsp:
  enabled: false
security:
  tirith_enabled: false
  allow_lazy_installs: false
skills:
  creation_nudge_interval: 0
"""


def _cache_dir() -> Path:
    return default_cache_dir().parent / "pip" / f"hermes-agent-{HERMES_VERSION}"


def install_hermes(cache_dir: Path | None = None) -> Path:
    """Install the pinned release once (a venv and `pip install`, under a lock, with a marker
    written last) and return its `hermes` executable. Raises on a failed install."""
    root = cache_dir or _cache_dir()
    exe, marker = root / "venv" / "bin" / "hermes", root / "installed"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and exe.exists():
            return exe
        # A venv cannot be moved once made, so it is made in place; the marker says it is whole.
        # Made without pip (a system Python may lack ensurepip), and filled by this Python's
        # pip, which installs into another interpreter's environment with `--python`.
        venv = root / "venv"
        subprocess.run(
            [sys.executable, "-m", "venv", "--clear", "--without-pip", str(venv)], check=True
        )
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
             "--quiet", "--disable-pip-version-check", f"{PACKAGE}=={HERMES_VERSION}"],
            capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if pip.returncode != 0 or not exe.exists():
            raise RuntimeError(f"pip install {PACKAGE}=={HERMES_VERSION}: {pip.stderr[-3000:]}")
        marker.write_text(HERMES_VERSION)
    return exe


@dataclass
class ChatRun:
    returncode: int
    session_id: str | None
    stdout: str
    stderr: str


@dataclass
class Hermes:
    exe: Path
    home: Path

    @classmethod
    def configured(
        cls, exe: Path, home: Path, *, base_url: str, api_key: str, verify_on_stop: bool
    ) -> Hermes:
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.yaml").write_text(
            CONFIG.format(
                base_url=base_url,
                api_key=api_key,
                verify_on_stop="true" if verify_on_stop else "false",
            )
        )
        # The update check has no switch; a fresh cache entry (kept 6 h) skips it.
        check = {"ts": time.time(), "behind": 0, "rev": None, "ver": HERMES_VERSION}
        (home / ".update_check").write_text(json.dumps(check))
        return cls(exe, home)

    def chat(
        self, prompt: str, *, cwd: Path, resume: str | None = None, timeout: float = 120
    ) -> ChatRun:
        """One `hermes chat -Q --yolo -q PROMPT` (resuming `resume`); stdout is not parsed (it
        mixes reasoning boxes and diffs), the session id comes from stderr."""
        argv = [str(self.exe), "chat", "-Q", "--yolo"]
        if resume is not None:
            argv += ["--resume", resume]
        argv += ["-q", prompt]
        env = {"HERMES_HOME": str(self.home), "HOME": str(self.home)}
        done = run_headless(argv, cwd=cwd, env=env, timeout=timeout, what="hermes")
        found = re.search(r"^session_id: (\S+)", done.stderr, re.M)
        return ChatRun(done.returncode, found.group(1) if found else None, done.stdout, done.stderr)
