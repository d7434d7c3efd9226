"""Real harness traffic the tests replay, kept in `tests/fixtures/` so a clone anywhere runs its
own tests. A missing fixture is an error, never a skip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Every request the real Claude Code 2.1.197 CLI sent in one short headless coding session.
CLAUDE_CODE = FIXTURES / "claude_code_2.1.197_edit_write_bash.json"
# The last `POST /v1/responses` request the real Codex CLI 0.169 sent in a 10-turn session.
CODEX = FIXTURES / "codex_0.169_responses_request.json"


def load(path: Path) -> Any:
    """The fixture's JSON; raises `FileNotFoundError` (a failing test) when it is missing."""
    return json.loads(path.read_text("utf-8"))
