"""The real Claude Code CLI as a user starts it, `claude "<prompt>"` in a terminal, against
tokentrail: the interactive mode names the session with a side request of its own.

Claude Code asks for a session title only where a person will see it: the interactive terminal
(at the start of the first turn, beside the agent's own request) and the Agent SDKs. A headless
`claude -p` run never asks: it is latched off by the gate `kYa()` (docs/harnesses/claude-code.md
quotes it). So the title request is driven here through a pseudo-terminal
(`support.claude_code_tty`), in the default configuration, with the known side requests
excluded: the ledger names the rule that fired, and the session gives one sample, its main
conversation, with every token it generated trained. Under TOKENTRAIL_RECORD_CORPUS the bodies
join `tests/fixtures/requests/`, the title request's texts whole.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from support.capture import Captured, capture, harness_adapter, write_corpus
from support.claude_code import install_claude_code
from support.claude_code_tty import run_claude_tty
from support.harness_versions import KEPT, LATEST
from support.serve import resume_checks, serving_in_thread
from tokentrail.engines.base import GenerateRequest
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.text.tokenizer import load_tokenizer

# The end of the title prompt in both releases' binaries; what the scripted model answers, and
# what the corpus keeps whole (with the `<session>` user message the title is drawn from).
TITLE_ASK = 'Return JSON with a single "title" field'
KEEP = (TITLE_ASK, "<session>")
TITLE = "Stray TODO markers"
TITLE_REPLY = json.dumps({"title": TITLE})
PROMPT = "Find the TODO comments in a.py."
# The releases and the rule each one's title request must fire (a bumped release fires the
# 2.1.332 rule for as long as its prompt is the same).
RULES = {
    LATEST["claude-code"].version: "known:claude-code 2.1.332 session title",
    KEPT["claude-code"].version: "known:claude-code 2.1.197 session title",
}


class TitledScript(ScriptedEngine):
    """The scripted engine, answering a title request with the JSON it asks for."""

    def choose(self, req: GenerateRequest) -> list[dict[str, Any]]:
        if _is_title(req.messages[0] if req.messages else {}):
            return [{"type": "text", "text": TITLE_REPLY}]
        return super().choose(req)


def _is_title(first: Any) -> bool:
    """Whether a system prompt (a string, blocks, or a translated message) asks for a title."""
    return TITLE_ASK in _text(first)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_text(v) for v in value)
    if isinstance(value, dict):
        return "\n".join(_text(v) for v in value.values())
    return ""


@pytest.fixture(scope="module", params=list(RULES))
def claude(request: pytest.FixtureRequest) -> tuple[str, Path]:
    version = request.param
    if shutil.which("npm") is None:
        reason = f"npm is missing: cannot install @anthropic-ai/claude-code@{version}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        print(f"\n*** SKIPPING the real Claude Code test: {reason} ***", file=sys.stderr)
        pytest.skip(reason)
    exe = install_claude_code(version=version)
    assert exe is not None
    return version, exe


def _posted(seen: list[Captured]) -> list[dict[str, Any]]:
    return [c.body for c in seen if c.method == "POST" and c.status == 200 and c.body]


def test_real_claude_code_in_a_terminal_names_its_session_and_the_title_is_excluded(
    claude: tuple[str, Path], tmp_path: Path
) -> None:
    version, exe = claude
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("x = 1  # TODO: name it\n")
    # Read needs no permission in the working directory: the session runs with no key pressed.
    main = [
        [{"type": "tool_use", "name": "Read", "input": {"file_path": str(repo / "a.py")}}],
        [{"type": "text", "text": "One TODO, in a.py line 1."}],
    ]
    tokenizer = load_tokenizer()
    log = tmp_path / "access.log"
    adapter = harness_adapter(TitledScript(tokenizer, main), tokenizer, log)
    seen = capture(adapter)

    def done() -> bool:
        bodies = _posted(seen)
        titled = any(_is_title(b.get("system")) for b in bodies)
        last = len(main) - 1
        return titled and any(
            sum(m.get("role") == "assistant" for m in b["messages"]) == last
            for b in bodies
            if not _is_title(b.get("system"))
        )

    with serving_in_thread(adapter) as (url, loop):
        run = run_claude_tty(
            exe, PROMPT, base_url=url, session_id="cc-title", cwd=repo, done=done, timeout=90
        )
        trajectory = asyncio.run_coroutine_threadsafe(
            adapter.finish_trajectory("cc-title", reward=1.0), loop
        ).result(60)
        metrics = adapter.metrics.render()[0].decode()
    if os.environ.get("TOKENTRAIL_RECORD_CORPUS"):
        write_corpus(
            f"claude_code_{version}_interactive_session_title",
            "claude-code",
            version,
            "interactive",
            seen,
            keep=KEEP,
        )
    assert run.exited_on_ctrl_c, run.screen[-2000:]
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert entries and not [e for e in entries if 400 <= e["status"] < 500], entries

    # One title request: the user's prompt inside <session> tags, no tools, a JSON schema.
    (title,) = [b for b in _posted(seen) if _is_title(b.get("system"))]
    assert f"<session>\n{PROMPT}\n</session>" in _text(title["messages"])
    assert title["tools"] == []
    assert title["output_config"]["format"]["schema"]["required"] == ["title"]

    ledger = trajectory.ledger
    rule = RULES[version]
    assert [t.excluded for t in ledger.turns].count(rule) == 1, [t.excluded for t in ledger.turns]
    assert all(t.excluded in (None, rule) for t in ledger.turns)
    excluded = sum(t.generated for t in ledger.turns if t.excluded is not None)
    assert excluded > 0
    assert ledger.trained_tokens == ledger.generated_tokens - excluded > 0
    # One sample: the main conversation, every turn of it; the title trains nowhere.
    (sample,) = trajectory.samples
    assert not sample.metadata["conversation"]["subagent"]
    kept = [i for i, t in enumerate(ledger.turns, 1) if t.excluded is None]
    assert sample.metadata["turns"] == kept and len(kept) == len(main)
    assert TITLE not in tokenizer.decode(list(sample.tokens))
    # The CLI took the reply for the session's name: it shows it.
    assert TITLE.encode() in run.screen
    assert "fork" not in trajectory.drift_counts
    checks = resume_checks(metrics)
    assert checks["mismatch"] == 0 and checks["same"] >= len(ledger.turns)
