"""The real Claude Code CLI (2.1.197, from npm) driven headless against `tokentrail serve`.

The scripted model Reads a file, Edits it (trailing whitespace, no `replace_all`), Writes a `.py`
file with trailing whitespace, runs Bash and ends. Claude Code re-renders the Edit and the Write
when it replays them; the adapter must restore both, and every turn must train. A second session
makes parallel calls where one fails and one is slow: Claude Code (2.1.332) answers them in the
order they finished, and each result must still render after its own call. A third runs 2.1.332
in its default configuration (only what a headless run needs) with a sub-agent: one sample for
the main conversation, one for the sub-agent, nothing forked. Two more run over
stand-in engines at real sizes: `vllm://` with the context past 64K tokens, and `sglang://` with
routed experts at 48 x 8; every generated token must train in both.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from support.capture import capture, harness_adapter, write_corpus
from support.claude_code import (
    CLAUDE_CODE_COMPLETION_ORDER_VERSION,
    CLAUDE_CODE_VERSION,
    install_claude_code,
    run_claude,
)
from support.engine_thread import engine_in_thread
from support.fake_engines import FakeSGLang, FakeVLLM
from support.serve import resume_checks, serving, serving_in_thread
from support.stand_in import scripted_reply
from support.sub_agents import SubAgentScript, cd_call
from tokentrail.adapter import Adapter, AdapterConfig
from tokentrail.core.routing import RoutingShape
from tokentrail.engines.sglang import SGLangEngine
from tokentrail.sim.moe import KVRouting
from tokentrail.text.tokenizer import load_tokenizer

CALC = "def add(a, b):\n    return a+b   \n\nprint(add(1, 2))\n"


def _script(repo: Path) -> list:
    calc, util = str(repo / "calc.py"), str(repo / "util.py")
    return [
        [
            {"type": "text", "text": "Let me look at calc.py first."},
            {"type": "tool_use", "name": "Read", "input": {"file_path": calc}},
        ],
        [
            {"type": "thinking", "thinking": "The return line needs spaces around +."},
            {
                "type": "tool_use",
                "name": "Edit",
                "input": {
                    "file_path": calc,
                    "old_string": "    return a+b   \n",
                    "new_string": "    # sum of a and b   \n    return a + b\n",
                },
            },
        ],
        [
            {
                "type": "tool_use",
                "name": "Write",
                "input": {"file_path": util, "content": "def mul(a, b):   \n    return a * b  \n"},
            }
        ],
        [
            {
                "type": "tool_use",
                "name": "Bash",
                "input": {"command": "python3 calc.py", "description": "Run calc.py"},
            }
        ],
        [{"type": "text", "text": "Fixed the spacing and added util.py."}],
    ]


def _install(version: str) -> Path:
    if shutil.which("npm") is None:
        reason = f"npm is missing: cannot install @anthropic-ai/claude-code@{version}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        print(f"\n*** SKIPPING the real Claude Code test: {reason} ***", file=sys.stderr)
        pytest.skip(reason)
    exe = install_claude_code(version=version)
    assert exe is not None
    return exe


@pytest.fixture(scope="module")
def claude_exe() -> Path:
    return _install(CLAUDE_CODE_VERSION)


@pytest.fixture(scope="module")
def claude_exe_completion_order() -> Path:
    return _install(CLAUDE_CODE_COMPLETION_ORDER_VERSION)


def test_real_claude_code_session_trains_every_edit_and_write(
    claude_exe: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    script = tmp_path / "script.json"
    script.write_text(json.dumps(_script(repo)))
    with serving(script) as served:
        run = run_claude(
            claude_exe,
            "Fix the spacing in calc.py and add util.py with mul().",
            base_url=served.url,
            session_id="cc-session",
            cwd=repo,
            timeout=180,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.result is not None and "util.py" in run.result.get("result", "")
        finished = served.finish("cc-session")
        checks = served.resume_checks()

    # The edits happened on disk, as Claude Code ran them (right-stripped).
    assert (repo / "calc.py").read_text() == (
        "def add(a, b):\n    # sum of a and b\n    return a + b\n\nprint(add(1, 2))\n"
    )
    assert (repo / "util.py").read_text() == "def mul(a, b):\n    return a * b\n"

    ledger = finished["ledger"]
    assert finished["samples"], "the session produced no sample"
    by_tool = ledger["by_tool"]
    for tool in ("Edit", "Write"):
        assert by_tool[tool]["turns"] == 1
        assert by_tool[tool]["turns_trained"] == 1
        assert by_tool[tool]["tokens_masked"] == 0
    # Claude Code rewrote exactly the Edit (default + strip) and the .py Write (strip).
    assert ledger["restored_echoes"] == 2
    assert ledger["restored_by_tool"] == {"Edit": 1, "Write": 1}
    assert ledger["trained_tokens"] == ledger["generated_tokens"]
    # Every request was translated resumed and in full, and the two were the same.
    assert checks["mismatch"] == 0 and checks["same"] >= len(ledger["turns"])


def _parallel_script(repo: Path) -> list:
    calc, missing, util, notes = (
        str(repo / n) for n in ("calc.py", "missing.py", "util.py", "NOTES.txt")
    )
    slow = "python3 -c \"import time; time.sleep(2); print('slow done')\""
    return [
        [
            {"type": "text", "text": "Reading all three."},
            {"type": "tool_use", "name": "Read", "input": {"file_path": calc}},
            {"type": "tool_use", "name": "Read", "input": {"file_path": missing}},
            {"type": "tool_use", "name": "Read", "input": {"file_path": util}},
        ],
        [
            {"type": "tool_use", "name": "Bash",
             "input": {"command": slow, "description": "Run the slow check"}},
            {"type": "tool_use", "name": "Read", "input": {"file_path": notes}},
        ],
        [{"type": "text", "text": "calc.py adds, util.py multiplies, missing.py is missing."}],
    ]  # fmt: skip


def test_real_claude_code_parallel_results_render_after_their_own_calls(
    claude_exe_completion_order: Path, tmp_path: Path
) -> None:
    # Claude Code 2.1.332 answers the three reads as [missing.py (failed), util.py, calc.py].
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("CALC_MARKER = 1\n")
    (repo / "util.py").write_text("UTIL_MARKER = 2\n")
    (repo / "NOTES.txt").write_text("NOTES_MARKER\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps(_parallel_script(repo)))
    with serving(script) as served:
        run = run_claude(
            claude_exe_completion_order,
            "What do calc.py, missing.py and util.py hold?",
            base_url=served.url,
            session_id="cc-parallel",
            cwd=repo,
            timeout=180,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        finished = served.finish("cc-parallel")
        checks = served.resume_checks()

    (sample,) = finished["samples"]
    prompt = load_tokenizer().decode(sample["tokens"])
    responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt, re.S)
    # Each result in its call's place: calc, missing (failed: the error marker), util; then the
    # slow Bash before the fast Read that finished first.
    assert len(responses) == 5, prompt
    assert "CALC_MARKER" in responses[0]
    assert responses[1].startswith("Error: ") and "does not exist" in responses[1]
    assert "UTIL_MARKER" in responses[2]
    assert "slow done" in responses[3]
    assert "NOTES_MARKER" in responses[4]
    ledger = finished["ledger"]
    assert ledger["trained_tokens"] == ledger["generated_tokens"]
    assert checks["mismatch"] == 0 and checks["same"] >= len(ledger["turns"])


# The sub-agent's prompt; its conversation is the one whose first user message holds it.
SUBAGENT_PROMPT = (
    "Search every file under the repository for TODO comments and report each one with its file."
)


def test_real_claude_code_in_its_default_configuration_gives_one_sample_per_conversation(
    claude_exe_completion_order: Path, tmp_path: Path
) -> None:
    # Without the two quieting switches Claude Code probes HEAD /api/hello, sends its betas and
    # a mid-conversation `system` note (its ~9 KB `# Environment` block) that it moves from a
    # block list to a string: the resumed translation must join that note once, every turn.
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("x = 1  # TODO: name it\n")
    main = [
        [
            {"type": "text", "text": "Delegating the search."},
            {
                "type": "tool_use",
                "name": "Agent",
                "input": {
                    "description": "Find TODOs",
                    "prompt": SUBAGENT_PROMPT,
                    "subagent_type": "general-purpose",
                },
            },
        ],
        [{"type": "text", "text": "One TODO, in a.py."}],
    ]
    sub = [
        [{"type": "tool_use", "name": "Read", "input": {"file_path": str(repo / "a.py")}}],
        [{"type": "text", "text": "a.py line 1: TODO: name it"}],
    ]
    tokenizer = load_tokenizer()
    adapter = Adapter(
        engine=SubAgentScript(tokenizer, main, sub, SUBAGENT_PROMPT),
        tokenizer=tokenizer,
        config=AdapterConfig(verify_resume=True),
    )
    with serving_in_thread(adapter) as (url, loop):
        run = run_claude(
            claude_exe_completion_order,
            "Find the TODOs in this repository with a sub-agent.",
            base_url=url,
            session_id="cc-default",
            cwd=repo,
            timeout=180,
            quiet=False,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        trajectory = asyncio.run_coroutine_threadsafe(
            adapter.finish_trajectory("cc-default", reward=1.0), loop
        ).result(60)
    checks = resume_checks(adapter.metrics.render()[0].decode())

    ledger = trajectory.ledger
    tags = sorted(s.metadata["conversation"]["subagent"] for s in trajectory.samples)
    assert tags == [False, True], [s.metadata["turns"] for s in trajectory.samples]
    assert "fork" not in trajectory.drift_counts
    # Each conversation's first turn is rendered, every later one spliced onto the tokens held.
    assert [t.history for t in ledger.turns].count("splice") == len(ledger.turns) - 2
    assert ledger.trained_tokens == ledger.generated_tokens > 0
    # The sub-agent's two turns are its own sample; the main conversation holds the rest.
    (sub_sample,) = [s for s in trajectory.samples if s.metadata["conversation"]["subagent"]]
    assert len(sub_sample.metadata["turns"]) == len(sub)
    for sample in trajectory.samples:
        prompt = tokenizer.decode(list(sample.tokens))
        assert prompt.count("You have been invoked in the following environment") <= 1
    main_sample = next(s for s in trajectory.samples if s is not sub_sample)
    assert "You have been invoked in the following environment" in tokenizer.decode(
        list(main_sample.tokens)
    )
    # Every request was translated resumed and in full, and the two were the same.
    assert checks["mismatch"] == 0 and checks["same"] >= len(ledger.turns)


def _bash(repo: Path, command: str) -> dict:
    return cd_call(repo, command, "Bash")


@pytest.mark.parametrize("configuration", ["default", "quiet"])
def test_real_claude_code_with_cd_prefixed_bash_and_a_sub_agent(
    claude_exe_completion_order: Path, tmp_path: Path, configuration: str
) -> None:
    # The latest release as a new user runs it (and with the two quieting switches): with no
    # CLAUDE_CODE_DISABLE_* switch its first request of every conversation sends
    # `thinking.display: "updates"` and its sub-agents run in the background; either way it
    # echoes each `cd <its own directory> && ...` Bash command without the `cd`. With the
    # known side requests excluded: one sample for the main conversation and one for the
    # sub-agent, no 4xx, every generated token of theirs trained, the rewritten echoes
    # restored by id. Under TOKENTRAIL_RECORD_CORPUS the bodies join tests/fixtures/requests.
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("x = 1  # TODO: name it\n")
    main = [
        [_bash(repo, "echo HI > hi.txt")],
        [
            {"type": "text", "text": "Delegating the search."},
            {
                "type": "tool_use",
                "name": "Agent",
                "input": {
                    "description": "Find TODOs",
                    "prompt": SUBAGENT_PROMPT,
                    "subagent_type": "general-purpose",
                },
            },
        ],
        [_bash(repo, "cat hi.txt")],
        [{"type": "text", "text": "hi.txt holds HI; one TODO, in a.py."}],
    ]
    sub = [
        [_bash(repo, "grep -rn TODO .")],
        [{"type": "tool_use", "name": "Read", "input": {"file_path": str(repo / "a.py")}}],
        [{"type": "text", "text": "a.py line 1: TODO: name it"}],
    ]
    tokenizer = load_tokenizer()
    log = tmp_path / "access.log"
    adapter = harness_adapter(SubAgentScript(tokenizer, main, sub, SUBAGENT_PROMPT), tokenizer, log)
    seen = capture(adapter)
    with serving_in_thread(adapter) as (url, loop):
        run = run_claude(
            claude_exe_completion_order,
            "Write HI into hi.txt, find the TODOs with a sub-agent, then show hi.txt.",
            base_url=url,
            session_id="cc-cd",
            cwd=repo,
            timeout=240,
            quiet=configuration == "quiet",
        )
        assert run.returncode == 0, run.stderr[-2000:]
        trajectory = asyncio.run_coroutine_threadsafe(
            adapter.finish_trajectory("cc-cd", reward=1.0), loop
        ).result(60)
        metrics = adapter.metrics.render()[0].decode()
    if os.environ.get("TOKENTRAIL_RECORD_CORPUS"):
        write_corpus(
            f"claude_code_{CLAUDE_CODE_COMPLETION_ORDER_VERSION}_{configuration}_cd_bash_subagent",
            "claude-code",
            CLAUDE_CODE_COMPLETION_ORDER_VERSION,
            configuration,
            seen,
        )
    assert (repo / "hi.txt").read_text() == "HI\n"
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert entries and not [e for e in entries if 400 <= e["status"] < 500], entries
    posted = [c for c in seen if c.method == "POST"]
    if configuration == "default":
        displays = {(c.body.get("thinking") or {}).get("display") for c in posted}
        assert "updates" in displays, "the default configuration no longer sends it"
        assert 'tokentrail_unknown_field_values_total{field="thinking.display"}' in metrics

    ledger = trajectory.ledger
    tags = sorted(s.metadata["conversation"]["subagent"] for s in trajectory.samples)
    assert tags == [False, True], [s.metadata["turns"] for s in trajectory.samples]
    assert "fork" not in trajectory.drift_counts
    excluded = sum(t.generated for t in ledger.turns if t.excluded is not None)
    assert ledger.trained_tokens == ledger.generated_tokens - excluded > 0
    assert all(t.excluded.startswith("known:") for t in ledger.turns if t.excluded)
    # Claude Code dropped the `cd` from the Bash echoes: restored by the ids we minted.
    assert ledger.restored_by_id.get("Bash", {}).get("arguments", 0) >= 1, ledger.restored_by_id
    (sub_sample,) = [s for s in trajectory.samples if s.metadata["conversation"]["subagent"]]
    main_sample = next(s for s in trajectory.samples if s is not sub_sample)
    text = tokenizer.decode(list(main_sample.tokens))
    assert f"cd {repo} && echo HI > hi.txt" in text and f"cd {repo} && cat hi.txt" in text
    checks = resume_checks(metrics)
    assert checks["mismatch"] == 0 and checks["same"] >= len(ledger.turns)


# A table file Claude Code reads in three parts of ~22K Qwen3 tokens each (its Read tool caps
# one read at 25K tokens), so the session's last prompt holds over 64K tokens.
TABLE_LINES, TABLE_PART = 2100, 700


def _long_context_script(repo: Path) -> list:
    calc, table = str(repo / "calc.py"), str(repo / "table.py")
    reads = [
        [{"type": "tool_use", "name": "Read",
          "input": {"file_path": table, "offset": 1 + k * TABLE_PART, "limit": TABLE_PART}}]
        for k in range(TABLE_LINES // TABLE_PART)
    ]  # fmt: skip
    return [
        [{"type": "tool_use", "name": "Read", "input": {"file_path": calc}}],
        *reads,
        [
            {
                "type": "tool_use",
                "name": "Edit",
                "input": {
                    "file_path": calc,
                    "old_string": "    return a+b   \n",
                    "new_string": "    return a + b\n",
                },
            }
        ],
        [{"type": "text", "text": "Fixed calc.py after reading the table."}],
    ]


def test_real_claude_code_over_vllm_at_a_64k_token_context(
    claude_exe: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    (repo / "table.py").write_text(
        "".join(
            f"VALUE_{i:04d} = {i * 37}  # row {i} of the lookup table\n" for i in range(1, 2101)
        )
    )
    script = _long_context_script(repo)
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(script))
    with engine_in_thread(FakeVLLM(scripted_reply(script))) as vllm:
        with serving(script_file, "--engine", f"vllm://{vllm.url}") as served:
            run = run_claude(
                claude_exe,
                "Read table.py, then fix the spacing in calc.py.",
                base_url=served.url,
                session_id="cc-vllm",
                cwd=repo,
                timeout=240,
            )
            assert run.returncode == 0, run.stderr[-2000:]
            finished = served.finish("cc-vllm")
            checks = served.resume_checks()

    prompts = [len(body["prompt"]) for body in vllm.bodies("/v1/completions")]
    assert max(prompts) > 64 * 1024, prompts
    assert len(vllm.answered) == len(script), prompts  # no retries: every answer was taken
    assert (repo / "calc.py").read_text() == CALC.replace("return a+b   ", "return a + b")
    ledger = finished["ledger"]
    assert finished["samples"], "the session produced no sample"
    assert ledger["generated_tokens"] > 0
    assert ledger["trained_tokens"] == ledger["generated_tokens"]
    assert checks["mismatch"] == 0 and checks["same"] >= len(ledger["turns"])


def test_real_claude_code_over_sglang_with_routed_experts_at_48x8(
    claude_exe: Path, tmp_path: Path
) -> None:
    """The session of the first test over `sglang://` (stand-in) with `--routed-experts` at
    Qwen3-30B-A3B's shape: every turn's rows (~19K tokens x 48 x 8 on the first) come back
    whole, every generated token trains and carries its routing."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    script = _script(repo)
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(script))
    fake = FakeSGLang(scripted_reply(script), routing=KVRouting(RoutingShape(48, 8, 128)))
    with engine_in_thread(fake) as sglang:
        with serving(
            script_file,
            "--engine", f"sglang://{sglang.url}",
            "--routed-experts", "--routing-shape", "48,8,128",
        ) as served:  # fmt: skip
            run = run_claude(
                claude_exe,
                "Fix the spacing in calc.py and add util.py with mul().",
                base_url=served.url,
                session_id="cc-moe",
                cwd=repo,
                timeout=240,
            )
            assert run.returncode == 0, run.stderr[-2000:]
            finished = served.finish("cc-moe")
            checks = served.resume_checks()

    first = fake.bodies("/generate")[0]
    assert len(first["input_ids"]) > 10_000 and first["return_routed_experts"] is True
    assert len(fake.answers) == len(script)
    assert (repo / "util.py").read_text() == "def mul(a, b):\n    return a * b\n"
    ledger = finished["ledger"]
    assert ledger["generated_tokens"] > 0
    assert ledger["trained_tokens"] == ledger["generated_tokens"]
    coverage = ledger["replay"]["routed_experts"]
    assert coverage["missing"] == {} and coverage["present"] == coverage["tokens"] > 10_000
    assert checks["mismatch"] == 0 and checks["same"] >= len(ledger["turns"])


@pytest.mark.parametrize("wire", ["sglang", "vllm"])
def test_real_claude_code_streams_token_by_token_from_a_streaming_engine(
    claude_exe: Path, tmp_path: Path, wire: str
) -> None:
    """The first test's session with `--engine-stream` over a stand-in that streams as the
    engine does, a token or two an event, after a 1.5 s wait before each turn's first token
    (keepalives every 0.3 s meanwhile): Claude Code takes every reply without a retry, and
    what is recorded is what the engine streamed, every token trained."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    script = _script(repo)
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(script))
    fake_cls = FakeSGLang if wire == "sglang" else FakeVLLM
    fake = fake_cls(scripted_reply(script), first_token_s=1.5, tokens_per_event=2)
    with engine_in_thread(fake) as engine:
        with serving(
            script_file, "--engine", f"{wire}://{engine.url}", "--engine-stream",
            "--keepalive", "0.3",
        ) as served:  # fmt: skip
            run = run_claude(
                claude_exe,
                "Fix the spacing in calc.py and add util.py with mul().",
                base_url=served.url,
                session_id=f"cc-stream-{wire}",
                cwd=repo,
                timeout=240,
            )
            assert run.returncode == 0, run.stderr[-2000:]
            finished = served.finish(f"cc-stream-{wire}")

    path = "/generate" if wire == "sglang" else "/v1/completions"
    assert all(body["stream"] is True for body in fake.bodies(path))
    assert len(fake.streamed) == len(script)  # no retries: every streamed answer was taken
    assert all(len(events) > 3 for events in fake.streamed.values())
    assert (repo / "util.py").read_text() == "def mul(a, b):\n    return a * b\n"
    ledger = finished["ledger"]
    streamed_tokens = (
        sum(len(body["output_token_logprobs"]) for body in fake.answers)
        if wire == "sglang"
        else sum(len(a["choices"][0]["token_ids"]) for a in fake.answered)
    )
    assert ledger["generated_tokens"] == streamed_tokens > 0
    assert ledger["trained_tokens"] == ledger["generated_tokens"]


@pytest.mark.parametrize("keepalive_s", [1.0, 400.0], ids=["keepalive", "none"])
def test_real_claude_code_waits_through_an_engine_stall_only_while_kept_alive(
    claude_exe: Path, tokenizer, tmp_path: Path, keepalive_s: float
) -> None:
    """`benches/keepalive_stall.py` scaled down: the engine waits 11 s before its first token
    and Claude Code's byte-level stream watchdog is at its least, 10 s
    (`CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS`, armed for a first-party base URL only), with no
    retries and a 2 s timeout for its non-streamed fallback. Kept alive (a `ping` a second) it
    takes the reply on its one request; with no keepalive before the first token it gives up."""
    reply = "The plan is sound."
    fake = FakeSGLang(scripted_reply([[{"type": "text", "text": reply}]]), first_token_s=11.0)
    env = {
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "_CLAUDE_CODE_ASSUME_FIRST_PARTY_BASE_URL": "1",
        "CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS": "10000",
        "API_TIMEOUT_MS": "2000",
    }
    with engine_in_thread(fake) as stand_in:
        client = SGLangEngine(stand_in.url, stream=True)
        adapter = Adapter(
            engine=client,
            tokenizer=tokenizer,
            config=AdapterConfig(live_stream=True, keepalive_s=keepalive_s),
        )
        with serving_in_thread(adapter) as (url, loop):
            debug = tmp_path / "claude-debug.txt"
            run = run_claude(
                claude_exe, "Check the plan.", base_url=url, session_id="cc-stall",
                cwd=tmp_path, env=env, timeout=60, extra_args=["--debug-file", str(debug)],
            )  # fmt: skip
            if keepalive_s < 11.0:
                assert run.returncode == 0, run.stderr[-2000:]
                trajectory = asyncio.run_coroutine_threadsafe(
                    adapter.finish_trajectory("cc-stall", reward=1.0), loop
                ).result(60)

    watchdog_fired = "[byte-watchdog] firing: idle=10000ms" in debug.read_text(errors="replace")
    if keepalive_s < 11.0:
        assert len(fake.bodies("/generate")) == 1  # no retry, no fallback
        assert run.result is not None and run.result["result"] == reply
        assert trajectory.ledger.trained_tokens == trajectory.ledger.generated_tokens > 0
        assert not watchdog_fired
    else:
        assert run.returncode != 0
        assert run.result is None or run.result.get("result") != reply
        assert watchdog_fired


@pytest.mark.parametrize("wire", ["sglang", "vllm"])
def test_real_claude_code_reads_a_png_as_vision_tokens(
    claude_exe: Path, tmp_path: Path, wire: str
) -> None:
    """Claude Code's Read of a PNG sends the image in the tool result; for Qwen3-VL the prompt
    holds its vision tokens and the sample carries the image. SGLang gets its bytes as
    `image_data` beside the ids; vLLM renders it (`/v1/chat/completions/render`) and samples
    from tokentrail's ids with the rendered features placed at its tokens
    (`/inference/v1/generate`)."""
    import base64
    import io

    from PIL import Image

    repo = tmp_path / "repo"
    repo.mkdir()
    shot = repo / "shot.png"
    Image.new("RGB", (320, 200), (200, 30, 30)).save(shot)
    script = [
        [{"type": "tool_use", "name": "Read", "input": {"file_path": str(shot)}}],
        [{"type": "text", "text": "A red rectangle."}],
    ]
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(script))
    fake = (FakeSGLang if wire == "sglang" else FakeVLLM)(scripted_reply(script))
    with engine_in_thread(fake) as engine:
        with serving(
            script_file, "--engine", f"{wire}://{engine.url}", "--tokenizer", "builtin:qwen3-vl"
        ) as served:
            run = run_claude(
                claude_exe,
                "What is in shot.png?",
                base_url=served.url,
                session_id="cc-image",
                cwd=repo,
                timeout=180,
            )
            assert run.returncode == 0, run.stderr[-2000:]
            finished = served.finish("cc-image")
            checks = served.resume_checks()

    (sample,) = finished["samples"]
    (image,) = sample["metadata"]["images"]
    data_url = f"data:{image['media_type']};base64,{image['data']}"
    tokenizer = load_tokenizer("builtin:qwen3-vl")
    pad = tokenizer.token_id("<|image_pad|>")
    if wire == "sglang":
        first, second = fake.bodies("/generate")
        assert "image_data" not in first
        assert second["image_data"] == [data_url]
        prompt = second["input_ids"]
    else:
        assert len(fake.bodies("/v1/completions")) == 1  # the turn before the image
        (render,) = fake.bodies("/v1/chat/completions/render")
        (part,) = render["messages"][0]["content"]
        assert part == {"type": "image_url", "image_url": {"url": data_url}}
        (second,) = fake.bodies("/inference/v1/generate")
        prompt = second["token_ids"]
        (place,) = second["features"]["mm_placeholders"]["image"]
        assert place == {"offset": image["offset"], "length": image["tokens"]}
        assert prompt == sample["tokens"][: len(prompt)]
    with Image.open(io.BytesIO(base64.b64decode(image["data"]))) as sent:
        assert sent.size == (image["width"], image["height"])
    assert prompt.count(pad) == image["tokens"] > 0
    assert (
        sample["tokens"][image["offset"] : image["offset"] + image["tokens"]]
        == [pad] * image["tokens"]
    )
    assert not sample["metadata"]["dropped_media"]
    ledger = finished["ledger"]
    assert ledger["trained_tokens"] == ledger["generated_tokens"] > 0
    # The image-holding request was translated resumed and in full, and the two were the same.
    assert checks["mismatch"] == 0 and checks["same"] >= len(ledger["turns"])
