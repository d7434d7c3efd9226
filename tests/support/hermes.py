"""Run the real hermes-agent CLI headless against a local OpenAI Chat Completions server.

`install_hermes` pip-installs the pinned release once into a virtual environment of its own
under the test cache (hermes-agent puts generic top-level modules such as `agent`, `tools` and
`utils` into site-packages, so it never shares an environment with tokentrail). `Hermes` is one
agent home (`$HERMES_HOME`) configured for a custom endpoint with no network besides it: no
update check, model-metadata lookup, security-scanner download, LSP install or lazy pip
install. That is all `Hermes.configured(..., verify_on_stop=None)` sets: hermes-agent's default
configuration otherwise (verify-on-stop "auto", on in the CLI; the skill-creation nudge and
background review every 10 tool-calling iterations). `Hermes.chat` runs
`hermes chat -Q --yolo [-resume ID] -q PROMPT` and returns the session id it printed. The API
key (the tokentrail session id) goes on every request; the hermes session id never reaches the
server.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from support.harness_versions import LATEST
from support.headless import run_headless
from support.pip import pip_install

HERMES_VERSION = LATEST["hermes-agent"].version
PACKAGE = LATEST["hermes-agent"].package

# What a run needs: the endpoint, and nothing downloaded (CI is offline).
CONFIG = """\
model:
  provider: custom
  base_url: {base_url}/v1
  api_key: {api_key}
  default: qwen3
  # Known, so hermes does not look the model up on openrouter.ai (it must be >= 64000).
  context_length: 131072
# No language servers installed on demand.
lsp:
  enabled: false
security:
  # No tirith scanner binary fetched from GitHub releases.
  tirith_enabled: false
  # No packages pip-installed on demand.
  allow_lazy_installs: false
"""
# And the switches the quiet tests add: verify-on-stop set either way, and no skill-creation
# nudge (nor the background review it starts).
QUIET = """\
agent:
  verify_on_stop: {verify_on_stop}
skills:
  creation_nudge_interval: 0
"""


def install_hermes(cache_dir: Path | None = None) -> Path:
    """Install the pinned release once (`support.pip`) and return its `hermes` executable.
    Raises on a failed install."""
    return pip_install(PACKAGE, HERMES_VERSION, "hermes", cache_dir)


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
        cls, exe: Path, home: Path, *, base_url: str, api_key: str, verify_on_stop: bool | None
    ) -> Hermes:
        """An agent home; `verify_on_stop=None` leaves hermes-agent's default configuration
        (the `QUIET` switches unset)."""
        home.mkdir(parents=True, exist_ok=True)
        config = CONFIG.format(base_url=base_url, api_key=api_key)
        if verify_on_stop is not None:
            config += QUIET.format(verify_on_stop="true" if verify_on_stop else "false")
        (home / "config.yaml").write_text(config)
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
