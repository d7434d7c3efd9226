"""Run the real Qwen Code CLI headless against a local OpenAI Chat Completions server.

`install_qwen_code` installs the pinned npm package once into a cache; `run_qwen` runs one
`qwen --auth-type openai --approval-mode yolo -o stream-json PROMPT` session in a scratch HOME
whose settings turn off everything that is not the agent's own requests (usage statistics,
telemetry, the managed auto-memory agent and its siblings, update checks), and returns its
stream-json events. `settings=DEFAULT_SETTINGS` runs the default configuration instead, and a
`home` kept across runs lets a later run `--continue` the session. The CLI sends the session id
as `Authorization: Bearer <session id>` and streams every `POST /v1/chat/completions`; it calls
no other path.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.harness_versions import LATEST
from support.headless import run_headless
from support.npm import npm_install

QWEN_CODE_VERSION = LATEST["qwen-code"].version
PACKAGE = LATEST["qwen-code"].package

# `~/.qwen/settings.json` for a CI run: with it, one run makes one loopback connection and no
# side request (measured with Qwen Code 0.24.4). Memory extraction is the one that matters: it
# runs in the background after a reply that answers the user, as an extra agent on the same key.
CI_SETTINGS = {
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "chatRecording": False},
    "memory": {
        "enableManagedAutoMemory": False,
        "enableManagedAutoDream": False,
        "enableAutoSkill": False,
    },
    "model": {"skipNextSpeakerCheck": True, "skipLoopDetection": True},
    "ui": {"enableFollowupSuggestions": False, "enableSpeculation": False},
    "experimental": {"emitToolUseSummaries": False},
    "ide": {"enabled": False},
    # The vendored ripgrep is installed without its exec bit; the built-in grep is quiet.
    "tools": {"useRipgrep": False},
}


# The default configuration, with the one switch a CI run needs: no auto-update, which would
# `npm install` a newer release over the pinned one (CI is offline). Everything else is Qwen
# Code's default: usage statistics on (its RUM endpoint is unreachable and fails quietly),
# chat recording on (so `--continue` works), the managed auto-memory extraction on (a side
# request after a reply that answers the user's prompt without a tool call), and the vendored
# ripgrep, which npm installs without its exec bit (Qwen Code then uses its built-in grep).
DEFAULT_SETTINGS = {"general": {"enableAutoUpdate": False}}


@dataclass
class QwenRun:
    returncode: int
    events: list[dict]
    stdout: str
    stderr: str

    @property
    def result(self) -> dict | None:
        """The final `{"type": "result", ...}` event, if the CLI got that far."""
        return next((e for e in reversed(self.events) if e.get("type") == "result"), None)


def _find_executable(prefix: Path) -> Path | None:
    exe = prefix / "node_modules" / ".bin" / "qwen"
    return exe if exe.exists() else None


def install_qwen_code(cache_dir: Path | None = None) -> Path | None:
    """Install the pinned CLI once and return its executable; None when npm is missing."""
    return npm_install(
        PACKAGE, QWEN_CODE_VERSION, f"qwen-code-{QWEN_CODE_VERSION}", _find_executable, cache_dir
    )


def run_qwen(
    exe: Path,
    prompt: str,
    *,
    base_url: str,
    session_id: str,
    cwd: Path,
    timeout: float = 120,
    model: str = "qwen3",
    settings: Mapping[str, Any] = CI_SETTINGS,
    home: Path | None = None,
    args: Sequence[str] = (),
) -> QwenRun:
    """Run one headless session in `cwd` with every tool approved, against `base_url` (the
    adapter's root; the CLI is pointed at its `/v1`), in `home` (a scratch one when None)
    with `settings` as its `~/.qwen/settings.json`; `args` go before the prompt."""
    with tempfile.TemporaryDirectory(prefix="qwen-home-") as scratch:
        root = home or Path(scratch)
        (root / ".qwen").mkdir(parents=True, exist_ok=True)
        (root / ".qwen" / "settings.json").write_text(json.dumps(settings))
        env = {
            "HOME": str(root),
            "OPENAI_BASE_URL": f"{base_url}/v1",
            "OPENAI_API_KEY": session_id,
            "OPENAI_MODEL": model,
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        }
        argv = [
            str(exe), "--auth-type", "openai", "--approval-mode", "yolo",
            "-o", "stream-json", "--max-session-turns", "20", *args, prompt,
        ]  # fmt: skip
        done = run_headless(argv, cwd=cwd, env=env, timeout=timeout, what="qwen")
    events = []
    for line in done.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return QwenRun(done.returncode, events, done.stdout, done.stderr)
