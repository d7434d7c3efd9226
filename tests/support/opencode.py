"""Run the real opencode CLI (`opencode-ai` from npm) headless against a local Chat Completions
server.

`install_opencode` installs the pinned package once into a cache; `run_opencode` runs one
`opencode run` in a scratch HOME with a project `opencode.json` that declares the adapter as an
OpenAI-compatible provider (the session id is its API key) and allows every tool. That is all a
headless run needs: opencode otherwise runs in its default configuration, so its title request
(`side.KNOWN_SIDE_REQUESTS`) comes first, beside the agent's own conversation.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from support.harness_versions import LATEST
from support.headless import run_headless
from support.npm import npm_install

OPENCODE_VERSION = LATEST["opencode"].version
PACKAGE = LATEST["opencode"].package
PROVIDER = "tokentrail"


@dataclass
class OpencodeRun:
    """What one headless run printed: its JSON events and its stderr."""

    returncode: int
    events: list[dict]
    stdout: str
    stderr: str

    def tool_outputs(self) -> list[str]:
        """The output of each completed tool call, in order."""
        return [
            str(e["part"]["state"].get("output", ""))
            for e in self.events
            if e.get("type") == "tool_use" and e["part"]["state"].get("status") == "completed"
        ]


def _find_executable(prefix: Path) -> Path | None:
    # The package ships its binary in a per-platform optional dependency; npm installs the
    # ones matching this machine, a baseline build (no AVX2 needed) among them, which sorts
    # first and runs anywhere.
    found = sorted((prefix / "node_modules").glob("opencode-linux-*/bin/opencode"))
    return found[0] if found else None


def install_opencode(cache_dir: Path | None = None) -> Path | None:
    """Install the pinned CLI once and return its executable; None when npm is missing."""
    return npm_install(
        PACKAGE, OPENCODE_VERSION, f"opencode-{OPENCODE_VERSION}", _find_executable, cache_dir
    )


def run_opencode(
    exe: Path,
    prompt: str,
    *,
    base_url: str,
    session_id: str,
    cwd: Path,
    timeout: float = 180,
    model: str = "qwen3",
) -> OpencodeRun:
    """Run `opencode run prompt` in `cwd` against `base_url` (the adapter's root)."""
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": PROVIDER,
                "options": {"baseURL": f"{base_url}/v1", "apiKey": session_id},
                "models": {model: {"name": model, "tool_call": True}},
            }
        },
        "model": f"{PROVIDER}/{model}",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "allow"},
    }
    (cwd / "opencode.json").write_text(json.dumps(config))
    with tempfile.TemporaryDirectory(prefix="opencode-home-") as home:
        env = {"HOME": home}
        argv = [str(exe), "run", "--format", "json", "-m", f"{PROVIDER}/{model}", prompt]
        done = run_headless(argv, cwd=cwd, env=env, timeout=timeout, what="opencode")
    events = []
    for line in done.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return OpencodeRun(done.returncode, events, done.stdout, done.stderr)
