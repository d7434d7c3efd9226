"""Run the real Claude Code CLI headless against a local Anthropic Messages server.

`install_claude_code` installs the pinned npm package once into a cache; `run_claude` runs one
`claude -p` session in a scratch HOME that talks to `base_url` only and returns its stream-json
events. The CLI sends the session id as `Authorization: Bearer <session_id>`, streams every
`POST /v1/messages?beta=true`, and first sends an unauthenticated `HEAD /` (any answer will do).

`quiet=False` runs it in its default configuration, with only what a headless run needs
(`HEADLESS_ENV`): it then probes `HEAD /api/hello`, sends the experimental betas and a
mid-conversation `system` note (its `# Environment` block), and tries its telemetry and update
endpoints, which fail fast here (no network; only loopback is reachable).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from support.harness_versions import KEPT, LATEST
from support.headless import run_headless
from support.npm import npm_install

# The release the recorded fixture and the quiet-configuration tests use.
CLAUDE_CODE_VERSION = KEPT["claude-code"].version
# The latest release (`support.harness_versions`): it answers parallel tool calls in the order
# they finished (errors and fast tools first), where 2.1.197 answers them in call order, and
# the default-configuration tests run it.
CLAUDE_CODE_LATEST = LATEST["claude-code"].version
CLAUDE_CODE_COMPLETION_ORDER_VERSION = CLAUDE_CODE_LATEST
PACKAGE = LATEST["claude-code"].package

# Environment of every run; nothing else is inherited from the caller but PATH, so a developer's
# own API key or proxy settings never reach the CLI. What a headless run needs:
HEADLESS_ENV = {
    # Needed as root: without it bypassPermissions refuses to start.
    "IS_SANDBOX": "1",
    # The CLI retries 5xx itself, with backoff; keep a broken server from turning into a long
    # wait. Each retry re-sends the identical body.
    "CLAUDE_CODE_MAX_RETRIES": "2",
}
# And, unless `quiet=False`, the two switches that keep requests to the agent's own:
QUIET_ENV = {
    # No telemetry, update checks or session-title side calls: only the agent's own requests.
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    # Drops the context-management and prompt-caching-scope betas, so requests have the shape
    # recorded in shared/fixtures/claude_code_2.1.197_edit_write_bash.json.
    "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
}
BASE_ENV = {**HEADLESS_ENV, **QUIET_ENV}


@dataclass
class ClaudeRun:
    """What one headless session printed: its stream-json events and its stderr."""

    returncode: int
    events: list[dict]
    stdout: str
    stderr: str

    @property
    def result(self) -> dict | None:
        """The final `{"type": "result", ...}` event, if the CLI got that far."""
        return next((e for e in reversed(self.events) if e.get("type") == "result"), None)


def install_claude_code(
    cache_dir: Path | None = None, version: str = CLAUDE_CODE_VERSION
) -> Path | None:
    """Install the pinned CLI once and return its executable; None when npm is missing."""
    return npm_install(PACKAGE, version, f"claude-code-{version}", _find_executable, cache_dir)


def _find_executable(prefix: Path) -> Path | None:
    # The package ships a native binary in a per-platform optional dependency
    # (@anthropic-ai/claude-code-linux-x64, ...); npm installs only the one matching this
    # machine. Its postinstall merely links that binary over bin/claude.exe, so use the
    # binary itself and do not depend on install scripts having run.
    scope = prefix / "node_modules" / "@anthropic-ai"
    found = sorted(p for p in scope.glob("claude-code-*/*") if p.name in ("claude", "claude.exe"))
    return found[0] if found else None


def run_claude(
    exe: Path,
    prompt: str,
    *,
    base_url: str,
    session_id: str,
    cwd: Path,
    timeout: float = 120,
    model: str = "test-model",
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    quiet: bool = True,
) -> ClaudeRun:
    """Run `claude -p prompt` in `cwd` with every permission granted, against `base_url`.

    `env` adds to or overrides `BASE_ENV` (`HEADLESS_ENV` alone when not `quiet`). Raises
    TimeoutError, after killing the CLI and anything it started, when the session outlasts
    `timeout` seconds.
    """
    with tempfile.TemporaryDirectory(prefix="claude-home-") as home:
        (Path(home) / ".claude.json").write_text(json.dumps({"hasCompletedOnboarding": True}))
        full_env = {
            "HOME": home,
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_AUTH_TOKEN": session_id,
            **(BASE_ENV if quiet else HEADLESS_ENV),
            **(env or {}),
        }
        argv = [
            str(exe), "-p", prompt, "--model", model,
            "--permission-mode", "bypassPermissions",
            "--output-format", "stream-json", "--verbose",
            *extra_args,
        ]  # fmt: skip
        done = run_headless(argv, cwd=cwd, env=full_env, timeout=timeout, what="claude")
    return ClaudeRun(done.returncode, _parse_events(done.stdout), done.stdout, done.stderr)


def _parse_events(stdout: str) -> list[dict]:
    events = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # the CLI prints the odd plain line; stdout keeps it
        if isinstance(event, dict):
            events.append(event)
    return events
