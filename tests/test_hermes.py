"""The real hermes-agent (0.19.0, from PyPI, in a venv of its own) driven headless against
`tokentrail serve`, with a thinking model.

hermes-agent replays every assistant message without its reasoning, with its content stripped
at both ends and its tool-call arguments re-serialized (sorted keys, compact, ASCII-escaped).
Its verify-on-stop loop nudges the model twice after an edit in a code workspace, and on
`--resume` it drops the answers those nudges superseded, the complete answer among them.

A third session runs hermes-agent in its default configuration (only the endpoint, and nothing
downloaded): a 10-iteration reply in a code workspace, after which hermes forks its background
skill review over the same conversation; the review is served and masked under its named rule.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from support.capture import capture, harness_adapter, write_corpus
from support.hermes import HERMES_VERSION, Hermes, install_hermes
from support.serve import Served, resume_checks, serving, serving_in_thread
from tokentrail.engines.base import GenerateRequest
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.text.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def hermes_exe() -> Path:
    try:
        return install_hermes()
    except (OSError, RuntimeError) as exc:
        reason = f"cannot install hermes-agent=={HERMES_VERSION}: {exc}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        print(f"\n*** SKIPPING the real hermes-agent test: {reason} ***", file=sys.stderr)
        pytest.skip(reason)


def _thinking(reasoning: str, text: str, *calls: tuple[str, dict]) -> list[dict]:
    blocks = [{"type": "thinking", "thinking": reasoning}, {"type": "text", "text": text}]
    blocks += [{"type": "tool_use", "name": name, "input": args} for name, args in calls]
    return blocks


# hermes replaces a one-letter key with "no-key-required": the session id must look like a key.
SID = "sess-hermes-0001"
COMPLETE_ANSWER = "Added add() to calc.py."
# Reply N answers a prompt holding N assistant messages. On resume hermes keeps one assistant
# message of the first turn's four, so the resumed prompt gets reply 2, which answers both
# nudge 1 and the resumed question.
VERIFY_SCRIPT = [
    _thinking(
        "  Let me write calc.py.  ",
        " I'll add add() to calc.py.\n",
        ("write_file", {"path": "calc.py", "content": "def add(a, b):\n    return a + b  # é\n"}),
    ),
    _thinking("The file is written.", COMPLETE_ANSWER),
    _thinking("There is no test runner.", "Not verified: no test runner is configured here."),
    _thinking("Still none.", "Still unverified: no test runner."),
]
PLAIN_SCRIPT = [
    _thinking("I need to read it first.", "", ("read_file", {"path": "calc.py"})),
    _thinking("It defines add.", "\ncalc.py defines add(a, b).\n"),
    _thinking("Two plus three.", "add(2, 3) returns 5."),
]


def _session(
    exe: Path, tmp_path: Path, script: list, workspace: Path, prompts: list[str], verify: bool
) -> dict:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    served: Served
    with serving(path, "--model-name", "qwen3") as served:
        hermes = Hermes.configured(
            exe, tmp_path / "hermes-home", base_url=served.url, api_key=SID, verify_on_stop=verify
        )
        resume = None
        for prompt in prompts:
            run = hermes.chat(prompt, cwd=workspace, resume=resume)
            assert run.returncode == 0, (run.stderr[-2000:], run.stdout[-2000:])
            assert run.session_id is not None
            resume = run.session_id
        finished = served.finish(SID)
        checks = served.resume_checks()
    # Every request was translated resumed and in full, and the two were the same.
    assert checks["mismatch"] == 0 and checks["same"] >= len(finished["ledger"]["turns"])
    return finished


def test_real_hermes_verify_on_stop_session_trains_the_complete_answer(
    hermes_exe: Path, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    # A project marker makes it a code workspace: the edit then gets both nudges.
    (workspace / "pyproject.toml").write_text('[project]\nname = "demo"\nversion = "0.1.0"\n')
    finished = _session(
        hermes_exe,
        tmp_path,
        VERIFY_SCRIPT,
        workspace,
        ["Add an add(a, b) function to calc.py", "Is add() verified?"],
        verify=True,
    )
    assert (workspace / "calc.py").read_text() == "def add(a, b):\n    return a + b  # é\n"
    ledger = finished["ledger"]
    # write, the complete answer, two answers to nudges, the resumed answer.
    assert len(ledger["turns"]) == 5
    assert ledger["trained_tokens"] == ledger["generated_tokens"]
    complete = ledger["turns"][1]
    assert complete["trained"] == complete["generated"] > 0
    # The resume forks where hermes collapsed the verification candidates into the last one
    # (the complete answer and the first nudge's answer are gone from its history): the first
    # turn's four replies are one sample, the resumed turn a second.
    assert len(finished["samples"]) <= 2
    decoded = [s["metadata"]["turns"] for s in finished["samples"]]
    assert [1, 2, 3, 4] in decoded


def test_real_hermes_plain_thinking_session_is_one_sample(hermes_exe: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    finished = _session(
        hermes_exe,
        tmp_path,
        PLAIN_SCRIPT,
        workspace,
        ["What is in calc.py?", "And what does add(2, 3) return?"],
        verify=False,
    )
    ledger = finished["ledger"]
    assert len(ledger["turns"]) == 3
    assert len(finished["samples"]) == 1
    assert finished["samples"][0]["metadata"]["turns"] == [1, 2, 3]
    assert ledger["trained_tokens"] == ledger["generated_tokens"]
    # Every replayed reply lost its reasoning (and the read its argument layout): restored.
    assert ledger["restored_echoes"] == 2


# Every start, hermes probes for the local servers it knows (LM Studio, Ollama, llama.cpp,
# vLLM) before `GET /v1/models`: tokentrail serves none of these routes, and answers 404.
SERVER_PROBES = {"/api/v1/models", "/api/tags", "/v1/props", "/props", "/version"}
REVIEW_RULE = f"known:hermes-agent {HERMES_VERSION} background review"
REVIEW_ASK = "Review the conversation above and "
TEST_CALC = "from calc import add\n\nassert add(2, 3) == 5\nprint('ok')\n"
# Ten tool-calling iterations, the last the answer: the skill-review threshold.
DEFAULT_SCRIPT = [
    _thinking("Is there an add() already?", "", ("search_files", {"pattern": "def add"})),
    _thinking("  What is this project?  ", "", ("read_file", {"path": "pyproject.toml"})),
    _thinking("None yet.", " Writing calc.py.\n",
              ("write_file", {"path": "calc.py", "content": "def add(a, b):\n    return a + b\n"})),
    _thinking("Check it.", "", ("read_file", {"path": "calc.py"})),
    _thinking("A test next.", "", ("write_file", {"path": "test_calc.py", "content": TEST_CALC})),
    _thinking("Run it.", "", ("terminal", {"command": "python3 test_calc.py"})),
    _thinking("And by hand.", "",
              ("terminal", {"command": "python3 -c 'import calc; print(calc.add(2, 3))'"})),
    _thinking("Look at the test again.", "", ("read_file", {"path": "test_calc.py"})),
    _thinking("What is in the workspace?", "", ("terminal", {"command": "ls"})),
    _thinking("Done.", "Added add() to calc.py; test_calc.py passes."),
]  # fmt: skip


class _WithReview(ScriptedEngine):
    """The script, and "Nothing to save." for hermes's background review (a replay of the
    whole conversation, which the script would answer by its assistant count)."""

    def choose(self, req: GenerateRequest) -> list[dict]:
        users = [m for m in req.messages if m.get("role") == "user"]
        if users and str(users[-1].get("content")).startswith(REVIEW_ASK):
            return [{"type": "text", "text": "Nothing to save."}]
        return super().choose(req)


def test_real_hermes_default_configuration_masks_its_background_review(
    hermes_exe: Path, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "pyproject.toml").write_text('[project]\nname = "demo"\nversion = "0.1.0"\n')
    tokenizer = load_tokenizer()
    log = tmp_path / "access.log"
    adapter = harness_adapter(_WithReview(tokenizer, DEFAULT_SCRIPT), tokenizer, log)
    seen = capture(adapter)
    with serving_in_thread(adapter) as (url, loop):
        hermes = Hermes.configured(
            hermes_exe, tmp_path / "hermes-home", base_url=url, api_key=SID, verify_on_stop=None
        )
        run = hermes.chat("Add an add(a, b) function to calc.py, with a test.", cwd=workspace)
        assert run.returncode == 0, (run.stderr[-2000:], run.stdout[-2000:])
        trajectory = asyncio.run_coroutine_threadsafe(
            adapter.finish_trajectory(SID, reward=1.0), loop
        ).result(60)
        metrics = adapter.metrics.render()[0].decode()
    if os.environ.get("TOKENTRAIL_RECORD_CORPUS"):
        name = f"hermes_agent_{HERMES_VERSION}_default_skill_review"
        write_corpus(name, "hermes-agent", HERMES_VERSION, "default", seen)
    assert (workspace / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert (workspace / "test_calc.py").read_text() == TEST_CALC
    posted = [c for c in seen if c.method == "POST"]
    reviews = [
        c for c in posted
        if str([m for m in c.body["messages"] if m["role"] == "user"][-1]["content"])
        .startswith(REVIEW_ASK)
    ]  # fmt: skip
    # The review runs in a daemon thread that races hermes's exit in `-q` mode: it is sent
    # when it wins (every solo run here), and a review cut short is the harness leaving (499).
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    refused = [e for e in entries if 400 <= e["status"] < 500]
    probes = {(e["method"], e["route"], e["status"]) for e in refused if e["method"] == "GET"}
    assert probes == {("GET", route, 404) for route in SERVER_PROBES}, refused
    left = [e for e in refused if e["method"] != "GET"]
    assert len(left) <= len(reviews) and {e["status"] for e in left} <= {499}, refused
    assert len(posted) - len(reviews) >= len(DEFAULT_SCRIPT)

    ledger = trajectory.ledger
    excluded = [t for t in ledger.turns if t.excluded is not None]
    assert len(excluded) <= len(reviews) and {t.excluded for t in excluded} <= {REVIEW_RULE}
    assert ledger.trained_tokens == ledger.generated_tokens - sum(t.generated for t in excluded)
    # The main conversation is one sample, every generated token of it trained.
    (sample,) = trajectory.samples
    assert sample.metadata["turns"] == [
        n for n, t in enumerate(ledger.turns, 1) if t.excluded is None
    ]
    assert ledger.trained_tokens > 0 and ledger.restored_echoes >= len(DEFAULT_SCRIPT) - 1
    checks = resume_checks(metrics)
    assert checks["mismatch"] == 0 and checks["same"] >= len(ledger.turns)
