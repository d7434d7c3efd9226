"""The real opencode CLI (the release `support.harness_versions` pins, from npm) in its default
configuration, driven headless against the adapter's Chat Completions API.

The scripted model runs a `cd`-prefixed bash command, hands a search to a sub-agent (`task`)
that runs one of its own, and ends. With the known side requests excluded, opencode's title
request is served and masked under its named rule; the main conversation and the sub-agent are
one sample each, every token of theirs trained, no 4xx, the resumed translation the full one.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from support.capture import capture, harness_adapter, write_corpus
from support.opencode import OPENCODE_VERSION, install_opencode, run_opencode
from support.serve import resume_checks, serving_in_thread
from support.sub_agents import SubAgentScript, cd_call
from tokentrail.engines.base import GenerateRequest
from tokentrail.text.tokenizer import load_tokenizer

SUBAGENT_PROMPT = "Search every file under the repository for TODO comments and list them."
TITLE = [{"type": "text", "text": "Write HI and find TODOs"}]


@pytest.fixture(scope="module")
def opencode_exe() -> Path:
    if shutil.which("npm") is None:
        reason = f"npm is missing: cannot install opencode-ai@{OPENCODE_VERSION}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        print(f"\n*** SKIPPING the real opencode test: {reason} ***", file=sys.stderr)
        pytest.skip(reason)
    exe = install_opencode()
    assert exe is not None
    return exe


class _Conversations(SubAgentScript):
    """The sub-agent script answering opencode's title request too."""

    def choose(self, req: GenerateRequest) -> list[dict]:
        system = str(req.messages[0].get("content")) if req.messages else ""
        if "You are a title generator" in system:
            return TITLE
        return super().choose(req)


def _bash(repo: Path, command: str) -> dict:
    return cd_call(repo, command, "bash")


def test_real_opencode_default_configuration_with_a_sub_agent(
    opencode_exe: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("x = 1  # TODO: name it\n")
    main = [
        [_bash(repo, "echo HI > hi.txt")],
        [
            {
                "type": "tool_use",
                "name": "task",
                "input": {
                    "description": "Find TODOs",
                    "prompt": SUBAGENT_PROMPT,
                    "subagent_type": "general",
                },
            }
        ],
        [{"type": "text", "text": "hi.txt holds HI; one TODO, in a.py."}],
    ]
    sub = [
        [_bash(repo, "grep -rn TODO a.py")],
        [{"type": "text", "text": "a.py line 1: TODO: name it"}],
    ]
    tokenizer = load_tokenizer()
    log = tmp_path / "access.log"
    adapter = harness_adapter(_Conversations(tokenizer, main, sub, SUBAGENT_PROMPT), tokenizer, log)
    seen = capture(adapter)
    with serving_in_thread(adapter) as (url, loop):
        run = run_opencode(
            opencode_exe,
            "Write HI into hi.txt, then find the TODOs with a sub-agent.",
            base_url=url,
            session_id="oc",
            cwd=repo,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        trajectory = asyncio.run_coroutine_threadsafe(
            adapter.finish_trajectory("oc", reward=1.0), loop
        ).result(60)
        metrics = adapter.metrics.render()[0].decode()
    if os.environ.get("TOKENTRAIL_RECORD_CORPUS"):
        name = f"opencode_{OPENCODE_VERSION}_default_cd_bash_subagent"
        write_corpus(name, "opencode", OPENCODE_VERSION, "default", seen)
    assert (repo / "hi.txt").read_text() == "HI\n"
    assert any("TODO: name it" in out for out in run.tool_outputs()), run.tool_outputs()
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert entries and not [e for e in entries if 400 <= e["status"] < 500], entries

    ledger = trajectory.ledger
    # The title request, served and masked under the rule that names it.
    reasons = [t.excluded for t in ledger.turns if t.excluded is not None]
    assert reasons and set(reasons) == {f"known:opencode {OPENCODE_VERSION} title generator"}
    tags = sorted(s.metadata["conversation"]["subagent"] for s in trajectory.samples)
    assert tags == [False, True], [s.metadata["turns"] for s in trajectory.samples]
    assert "fork" not in trajectory.drift_counts
    excluded = sum(t.generated for t in ledger.turns if t.excluded is not None)
    assert ledger.trained_tokens == ledger.generated_tokens - excluded > 0
    checks = resume_checks(metrics)
    assert checks["mismatch"] == 0 and checks["same"] >= len(ledger.turns)
