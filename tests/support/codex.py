"""Run the real OpenAI Codex CLI headless against a local Responses API server.

`install_codex` installs the pinned npm package once into a cache; `run_codex` runs one
`codex exec --json` turn (or a `resume` of a thread) with a scratch CODEX_HOME whose only
provider is `base_url`, and returns its JSON events. Codex sends the session id as
`Authorization: Bearer <session_id>` (the provider's `env_key`) and streams every
`POST {base_url}/responses`; with the config below it opens no other connection.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from support.harness_versions import LATEST
from support.npm import npm_install

CODEX_VERSION = LATEST["codex"].version
PACKAGE = LATEST["codex"].package
# The slug for which Codex offers `apply_patch` as a free-form custom tool.
MODEL = "gpt-5.5"

CONFIG = """\
model = "{model}"
model_provider = "tokentrail"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false
unbounded_connection_retries = false

[model_providers.tokentrail]
name = "tokentrail"
base_url = "{base_url}/v1"
env_key = "TOKENTRAIL_SESSION"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 30000
"""


@dataclass
class CodexRun:
    returncode: int
    events: list[dict]
    stdout: str
    stderr: str

    @property
    def thread_id(self) -> str | None:
        started = next((e for e in self.events if e.get("type") == "thread.started"), None)
        return started.get("thread_id") if started else None

    def items(self, kind: str) -> list[dict]:
        """Completed items of one type (`command_execution`, `file_change`, `agent_message`)."""
        return [
            e["item"]
            for e in self.events
            if e.get("type") == "item.completed" and e.get("item", {}).get("type") == kind
        ]


def install_codex(cache_dir: Path | None = None) -> Path | None:
    """Install the pinned CLI once and return its executable; None when npm is missing."""
    return npm_install(
        PACKAGE, CODEX_VERSION, f"codex-{CODEX_VERSION}", _find_executable, cache_dir
    )


def _find_executable(prefix: Path) -> Path | None:
    # The package's launcher (bin/codex.js) runs the native binary of this platform, which
    # npm installs as an optional dependency (@openai/codex-linux-x64, ...). Use the binary.
    scope = prefix / "node_modules" / "@openai"
    found = sorted(scope.glob("codex-*/vendor/*/bin/codex"))
    return found[0] if found else None


def write_home(home: Path, base_url: str, model: str = MODEL) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(CONFIG.format(model=model, base_url=base_url))
    return home


def run_codex(
    exe: Path,
    prompt: str,
    *,
    home: Path,
    session_id: str,
    cwd: Path,
    resume: str | None = None,
    timeout: float = 120,
    extra_args: Sequence[str] = (),
) -> CodexRun:
    """One `codex exec` turn in `cwd` (a `resume` of thread `resume` when given).

    Stdin is closed (with an open pipe Codex waits for EOF before it starts). Raises
    TimeoutError, after killing the CLI and what it started, past `timeout` seconds.
    """
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "CODEX_HOME": str(home),
        "TOKENTRAIL_SESSION": session_id,
    }
    argv = [str(exe), "exec", "--skip-git-repo-check", "--json", *extra_args]
    argv += ["resume", resume, prompt] if resume else [prompt]
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise TimeoutError(
            f"codex did not finish within {timeout}s (killed); stderr tail: {stderr[-2000:]!r}"
        ) from None
    events = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return CodexRun(proc.returncode, events, stdout, stderr)
