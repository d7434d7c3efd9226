"""The real Qwen Code CLI (0.24.4, from npm) driven headless against `tokentrail serve`: the
OpenAI Chat Completions side with a real harness.

The scripted model reads two files in parallel, makes an edit that fails and then one that
succeeds, writes a file, runs a shell command and answers. Qwen Code replays every reply with
its reasoning trimmed and its arguments re-serialized; the session must be one sample with
every generated token trained, the trimmed reasoning restored.

A third session runs Qwen Code in its default configuration (no auto-update, nothing else set):
a fix with tools, then `--continue` with a question it answers directly, after which Qwen Code
runs its managed memory extraction on the same key; that side request is served and masked
under its named rule.
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
from support.engine_thread import engine_in_thread
from support.fake_engines import FakeSGLang, FakeVLLM
from support.qwen_code import DEFAULT_SETTINGS, QWEN_CODE_VERSION, install_qwen_code, run_qwen
from support.serve import resume_checks, serving, serving_in_thread
from support.stand_in import scripted_reply
from tokentrail.engines.base import GenerateRequest
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.text.tokenizer import load_tokenizer

CALC = "def add(a, b):\n    return a+b\n"


def _script(repo: Path) -> list:
    calc, readme, notes = (str(repo / n) for n in ("calc.py", "README.md", "NOTES.md"))
    check = "python3 -c 'import calc; print(calc.add(2, 3))'"
    return [
        [
            {"type": "thinking", "thinking": "I should read both files first."},
            {"type": "tool_use", "name": "read_file", "input": {"file_path": calc}},
            {"type": "tool_use", "name": "read_file", "input": {"file_path": readme}},
        ],
        [
            # Qwen Code trims the reasoning it replays: this one comes back without the
            # whitespace at its ends, and must be restored.
            {"type": "thinking", "thinking": "\n  The return line needs spaces.  \n"},
            {"type": "tool_use", "name": "edit",
             "input": {"file_path": calc, "old_string": "    return a +b",
                       "new_string": "    return a + b"}},
        ],
        [
            {"type": "thinking", "thinking": "The old string was wrong; retry with the file's."},
            {"type": "tool_use", "name": "edit",
             "input": {"file_path": calc, "old_string": "    return a+b",
                       "new_string": "    return a + b"}},
        ],
        [
            {"type": "text", "text": "Writing the notes."},
            {"type": "tool_use", "name": "write_file",
             "input": {"file_path": notes, "content": "calc.py: add() is spaced.\n"}},
        ],
        [
            {"type": "tool_use", "name": "run_shell_command",
             "input": {"command": check, "description": "Check add()"}},
        ],
        [{"type": "text", "text": "Fixed calc.py and wrote NOTES.md; add(2, 3) is 5."}],
    ]  # fmt: skip


@pytest.fixture(scope="module")
def qwen_exe() -> Path:
    if shutil.which("npm") is None:
        reason = f"npm is missing: cannot install @qwen-code/qwen-code@{QWEN_CODE_VERSION}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        print(f"\n*** SKIPPING the real Qwen Code test: {reason} ***", file=sys.stderr)
        pytest.skip(reason)
    exe = install_qwen_code()
    assert exe is not None
    return exe


def _tool_results(events: list[dict]) -> list[str]:
    out = []
    for event in events:
        if event.get("type") != "user":
            continue
        for block in event.get("message", {}).get("content") or ():
            if isinstance(block, dict) and block.get("type") == "tool_result":
                content = block.get("content")
                if isinstance(content, list):
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                out.append(str(content))
    return out


def test_real_qwen_code_session_is_one_sample_and_trains_everything(
    qwen_exe: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    (repo / "README.md").write_text("# calc\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps(_script(repo)))
    with serving(script) as served:
        run = run_qwen(
            qwen_exe,
            "Fix the spacing in calc.py, note it in NOTES.md and check add(2, 3).",
            base_url=served.url,
            session_id="qwen-session",
            cwd=repo,
            timeout=180,
        )
        assert run.returncode == 0, (run.stderr[-2000:], run.stdout[-2000:])
        assert run.result is not None and run.result.get("subtype") == "success"
        finished = served.finish("qwen-session")
        checks = served.resume_checks()

    assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert (repo / "NOTES.md").read_text() == "calc.py: add() is spaced.\n"
    results = _tool_results(run.events)
    assert len(results) == 6
    assert "0 occurrences found" in results[2]
    assert "5" in results[5]

    ledger = finished["ledger"]
    assert len(ledger["turns"]) == 6
    assert len(finished["samples"]) == 1
    assert ledger["trained_tokens"] == ledger["generated_tokens"] > 0
    assert ledger["restored_echoes"] == 1
    assert ledger["restored_by_tool"] == {"edit": 1}
    # Every request was translated resumed and in full, and the two were the same.
    assert checks["mismatch"] == 0 and checks["same"] >= len(ledger["turns"])


@pytest.mark.parametrize("wire", ["sglang", "vllm"])
def test_real_qwen_code_streams_token_by_token_from_a_streaming_engine(
    qwen_exe: Path, tmp_path: Path, wire: str
) -> None:
    """The session above with `--engine-stream` over a stand-in that streams as the engine
    does (a token or two an event, 1 s before each first token, keepalives every 0.3 s): Qwen
    Code's Chat Completions stream takes every reply, and what is recorded is what the engine
    streamed, every token trained, one sample."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    (repo / "README.md").write_text("# calc\n")
    script = _script(repo)
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(script))
    fake_cls = FakeSGLang if wire == "sglang" else FakeVLLM
    fake = fake_cls(scripted_reply(script), first_token_s=1.0, tokens_per_event=2)
    with engine_in_thread(fake) as engine:
        with serving(
            script_file, "--engine", f"{wire}://{engine.url}", "--engine-stream",
            "--keepalive", "0.3",
        ) as served:  # fmt: skip
            run = run_qwen(
                qwen_exe,
                "Fix the spacing in calc.py, note it in NOTES.md and check add(2, 3).",
                base_url=served.url,
                session_id=f"qwen-stream-{wire}",
                cwd=repo,
                timeout=180,
            )
            assert run.returncode == 0, (run.stderr[-2000:], run.stdout[-2000:])
            finished = served.finish(f"qwen-stream-{wire}")

    assert (repo / "NOTES.md").read_text() == "calc.py: add() is spaced.\n"
    path = "/generate" if wire == "sglang" else "/v1/completions"
    assert all(body["stream"] is True for body in fake.bodies(path))
    assert len(fake.streamed) == len(script)
    assert all(len(events) > 3 for events in fake.streamed.values())
    ledger = finished["ledger"]
    assert len(finished["samples"]) == 1
    assert ledger["trained_tokens"] == ledger["generated_tokens"] > 0


MEMORY_RULE = f"known:qwen-code {QWEN_CODE_VERSION} memory extraction"
MEMORY_AGENT = "You are now acting as the managed memory extraction subagent"


class _WithMemory(ScriptedEngine):
    """The script, and a reply that saves nothing for the memory extraction agent (it carries
    the conversation so far, which the script would answer by its assistant count)."""

    def choose(self, req: GenerateRequest) -> list[dict]:
        if req.messages and str(req.messages[0].get("content")).startswith(MEMORY_AGENT):
            return [{"type": "text", "text": "Nothing durable to save."}]
        return super().choose(req)


def test_real_qwen_code_default_configuration_masks_its_memory_extraction(
    qwen_exe: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    calc = str(repo / "calc.py")
    script = [
        [
            {"type": "thinking", "thinking": "Read it first."},
            {"type": "tool_use", "name": "read_file", "input": {"file_path": calc}},
        ],
        [{"type": "tool_use", "name": "edit",
          "input": {"file_path": calc, "old_string": "    return a+b",
                    "new_string": "    return a + b"}}],
        [{"type": "text", "text": "Fixed the spacing in calc.py."}],
        [{"type": "text", "text": "add(2, 3) returns 5."}],
    ]  # fmt: skip
    tokenizer = load_tokenizer()
    log = tmp_path / "access.log"
    adapter = harness_adapter(_WithMemory(tokenizer, script), tokenizer, log)
    seen = capture(adapter)
    home = tmp_path / "home"
    prompts = [("Fix the spacing in calc.py.", ()), ("What does add(2, 3) return?", ("-c",))]
    with serving_in_thread(adapter) as (url, loop):
        for prompt, args in prompts:
            run = run_qwen(
                qwen_exe, prompt, base_url=url, session_id="qwen-default", cwd=repo,
                timeout=180, settings=DEFAULT_SETTINGS, home=home, args=args,
            )  # fmt: skip
            assert run.returncode == 0, (run.stderr[-2000:], run.stdout[-2000:])
            assert run.result is not None and run.result.get("subtype") == "success"
        trajectory = asyncio.run_coroutine_threadsafe(
            adapter.finish_trajectory("qwen-default", reward=1.0), loop
        ).result(60)
        metrics = adapter.metrics.render()[0].decode()
    if os.environ.get("TOKENTRAIL_RECORD_CORPUS"):
        name = f"qwen_code_{QWEN_CODE_VERSION}_default_continue_memory"
        write_corpus(name, "qwen-code", QWEN_CODE_VERSION, "default", seen)
    assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert entries and not [e for e in entries if 400 <= e["status"] < 500], entries
    assert {c.path for c in seen} == {"/v1/chat/completions"}

    ledger = trajectory.ledger
    # The answer to the continued prompt (no tool call) starts the memory extraction.
    assert [t.excluded for t in ledger.turns] == [None] * len(script) + [MEMORY_RULE]
    excluded = ledger.turns[-1].generated
    assert ledger.trained_tokens == ledger.generated_tokens - excluded > 0
    # `--continue` replays the first prompt without the date reminder Qwen Code sent with it:
    # the continued turn renders as a sample of its own, nothing restored by force.
    assert [s.metadata["turns"] for s in trajectory.samples] == [[1, 2, 3], [4]]
    assert "fork" not in trajectory.drift_counts
    checks = resume_checks(metrics)
    assert checks["mismatch"] == 0 and checks["same"] >= len(ledger.turns)
