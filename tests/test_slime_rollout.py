"""slime's rollout contract (`tests/test_agent/test_agent_rollout_cpu.py` in THUDM/slime) on
`tokentrail.integrations.slime`: a slime-style `generate()` (open the session, run the agent,
finish into samples) with the adapter app on a thread of its own as slime runs it, and the
stand-in SGLang (SGLang's `/generate` wire format) as the engine, the tokenizer a real Hugging
Face one.

slime's own test stands a coroutine in for the agent; here that case is kept, and the agents
are also the real Claude Code and Codex CLIs (pinned, from npm) driven headless: Claude Code
over the Anthropic Messages API, Codex over the Responses API (the only one Codex 0.169 speaks).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from support.claude_code import install_claude_code, run_claude
from support.codex import install_codex, run_codex, write_home
from support.fake_engines import FakeSGLang
from support.slime import ByPrompt, ScriptedReplies, generate, hf_tokenizer, run_app_in_thread
from tokentrail.integrations.slime import AnthropicAdapter, OpenAIAdapter, sample_class
from tokentrail.sim.codex import CALC, GOOD_PATCH, TEST

Sample = sample_class()


@pytest.fixture(scope="module")
def hf(tokenizer):
    return hf_tokenizer(tokenizer)


def _base_sample(index: int = 0) -> Any:
    return Sample(
        index=index, group_index=0, prompt="fix the bug", metadata={"instance_id": "demo-1"}
    )


def _npm_or_skip(what: str) -> None:
    if shutil.which("npm") is None:
        reason = f"npm is missing: cannot install {what}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        print(f"\n*** SKIPPING the real {what} test: {reason} ***", file=sys.stderr)
        pytest.skip(reason)


def _every_turn_trained(samples: list[Any]) -> None:
    for s in samples:
        assert s.status == Sample.Status.COMPLETED
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
        for entry in s.metadata["ledger"]:
            assert entry["trained"] == entry["generated"] > 0, entry


async def _anthropic_agent(url: str, sid: str, n_turns: int = 2) -> int:
    """slime's stand-in for `claude -p`: a few Anthropic turns over loopback."""
    history: list[dict] = [
        {"role": "user", "content": [{"type": "text", "text": "solve the issue"}]}
    ]
    async with aiohttp.ClientSession(trust_env=False) as session:
        for _ in range(n_turns):
            async with session.post(
                f"{url}/v1/messages",
                headers={"Authorization": f"Bearer {sid}"},
                json={"model": "m", "max_tokens": 64, "messages": history},
            ) as r:
                assert r.status == 200, await r.text()
                data = await r.json()
            history.append({"role": "assistant", "content": data["content"]})
            history.append({"role": "user", "content": [{"type": "text", "text": "continue"}]})
    return 0


async def _chat_agent(url: str, sid: str, n_turns: int = 2) -> int:
    """slime's stand-in for a chat-completions agent."""
    history: list[dict] = [{"role": "user", "content": "solve the issue"}]
    async with aiohttp.ClientSession(trust_env=False) as session:
        for _ in range(n_turns):
            async with session.post(
                f"{url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {sid}"},
                json={"model": "m", "max_tokens": 64, "messages": history},
            ) as r:
                assert r.status == 200, await r.text()
                data = await r.json()
            history.append(
                {"role": "assistant", "content": data["choices"][0]["message"]["content"]}
            )
            history.append({"role": "user", "content": "continue"})
    return 0


def _rollout(
    cls: type, hf: Any, replies: ScriptedReplies, agent: Any, **adapter_kw: Any
) -> list[Any]:
    async def run() -> list[Any]:
        async with FakeSGLang(reply=replies) as sglang:
            adapter = cls(tokenizer=hf, sglang_url=sglang.url, **adapter_kw)
            handle = run_app_in_thread(adapter.app)
            try:
                url = f"http://127.0.0.1:{handle.port}"
                return await generate(adapter, url, _base_sample(), {"max_new_tokens": 256}, agent)
            finally:
                handle.stop()

    return asyncio.run(run())


def test_generate_produces_trained_samples(hf) -> None:
    replies = ScriptedReplies(hf, ["let me look at the code", "the fix is applied done"])
    samples = _rollout(AnthropicAdapter, hf, replies, _anthropic_agent)
    assert len(samples) == 1
    (s,) = samples
    _every_turn_trained(samples)
    assert s.metadata["agent_exit_code"] == 0 and s.metadata["instance_id"] == "demo-1"
    assert s.reward == 1.0 and s.index == 0 and s.group_index == 0 and s.prompt == "fix the bug"
    assert s.tokens == replies.prompts[-1] + replies.outputs[-1]
    assert sum(s.loss_mask) == sum(len(o) for o in replies.outputs)


def test_generate_aborts_on_empty_trajectory(hf) -> None:
    async def silent(url: str, sid: str) -> int:
        return 0

    samples = _rollout(AnthropicAdapter, hf, ScriptedReplies(hf, []), silent)
    assert len(samples) == 1
    assert samples[0].status == Sample.Status.ABORTED
    assert samples[0].metadata["abort_reason"] == "adapter_session_empty"


def test_chat_completions_rollout_closes_loop(hf) -> None:
    replies = ScriptedReplies(hf, ["looking", "done"])
    samples = _rollout(OpenAIAdapter, hf, replies, _chat_agent)
    assert len(samples) == 1
    _every_turn_trained(samples)
    assert samples[0].tokens == replies.prompts[-1] + replies.outputs[-1]


# -- the real CLIs ------------------------------------------------------------------------------

CC_PROMPT = "Fix the spacing in calc.py."
CC_CALC = "def add(a, b):\n    return a+b\n\nprint(add(1, 2))\n"


def _claude_script(repo: Path) -> list:
    calc = str(repo / "calc.py")
    return [
        [
            {"type": "text", "text": "Reading calc.py."},
            {"type": "tool_use", "name": "Read", "input": {"file_path": calc}},
        ],
        [
            {
                "type": "tool_use",
                "name": "Edit",
                "input": {
                    "file_path": calc,
                    "old_string": "    return a+b\n",
                    # trailing blanks: Claude Code strips them when it replays the call
                    "new_string": "    return a + b   \n",
                },
            }
        ],
        [
            {
                "type": "tool_use",
                "name": "Bash",
                "input": {"command": "python3 calc.py", "description": "Run calc.py"},
            }
        ],
        [{"type": "text", "text": "calc.py now spaces its sum."}],
    ]


def _claude_rollout(hf: Any, tmp_path: Path, **adapter_kw: Any) -> tuple[list, ByPrompt, Path]:
    _npm_or_skip("Claude Code")
    exe = install_claude_code()
    assert exe is not None
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CC_CALC)
    replies = ByPrompt(hf, _claude_script(repo), CC_PROMPT)

    async def claude(url: str, sid: str) -> int:
        run = await asyncio.to_thread(
            run_claude, exe, CC_PROMPT, base_url=url, session_id=sid, cwd=repo, timeout=180
        )
        assert run.result is not None, run.stderr[-2000:]
        return run.returncode

    samples = _rollout(AnthropicAdapter, hf, replies, claude, **adapter_kw)
    assert (
        repo / "calc.py"
    ).read_text() == "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n"
    return samples, replies, repo


def test_generate_runs_a_real_claude_code_session(hf, tmp_path: Path) -> None:
    samples, replies, _ = _claude_rollout(hf, tmp_path)
    main = [s for s in samples if not s.metadata["conversation"]["subagent"]]
    assert len(main) == 1, [s.metadata["conversation"] for s in samples]
    (s,) = main
    assert s.metadata["agent_exit_code"] == 0
    # Every turn trains: the re-rendered Edit was restored, so nothing drifted or forked.
    _every_turn_trained(samples)
    assert [e["tools"] for e in s.metadata["ledger"]] == [["Read"], ["Edit"], ["Bash"], []]
    last = max(i for i, p in enumerate(replies.prompts) if CC_PROMPT in hf.decode(p))
    assert s.tokens == replies.prompts[last] + replies.outputs[last]


def test_slimes_prompt_building_loses_the_edit(hf, tmp_path: Path, caplog) -> None:
    """The same session built as slime builds prompts (no echo restore, every prompt rendered
    in full): Claude Code's re-rendered Edit no longer matches what was sampled, the Edit turn
    trains nowhere, and the adapter's WARNING names it."""
    with caplog.at_level(logging.WARNING):
        samples, _, _ = _claude_rollout(hf, tmp_path, restore="off", history="render")
    turns = sorted(e["turn_index"] for s in samples for e in s.metadata["ledger"])
    assert turns == [1, 3, 4]  # turn 2, the Edit, is in no sample
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("lost training signal" in w and "Edit" in w for w in warnings), warnings


CODEX_PROMPT = "Space the sum in calc.py."


def _codex_script() -> list:
    def call(name: str, **arguments: str) -> dict:
        return {"type": "tool_use", "name": name, "input": arguments}

    return [
        [{"type": "text", "text": "Looking at the code."}, call("exec_command", cmd="cat calc.py")],
        [call("apply_patch", input=GOOD_PATCH)],
        [call("exec_command", cmd="python3 test_calc.py")],
        [{"type": "text", "text": "calc.py now spaces its sum and the test passes."}],
    ]


def test_generate_runs_a_real_codex_session(hf, tmp_path: Path) -> None:
    _npm_or_skip("Codex")
    exe = install_codex()
    assert exe is not None
    work = tmp_path / "work"
    work.mkdir()
    (work / "calc.py").write_text(CALC)
    (work / "test_calc.py").write_text(TEST)
    replies = ByPrompt(hf, _codex_script(), CODEX_PROMPT)

    async def codex(url: str, sid: str) -> int:
        home = write_home(tmp_path / "codex-home", url)
        run = await asyncio.to_thread(
            run_codex, exe, CODEX_PROMPT, home=home, session_id=sid, cwd=work, timeout=180
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.items("file_change"), run.stdout[-3000:]
        return run.returncode

    samples = _rollout(OpenAIAdapter, hf, replies, codex)
    assert (work / "calc.py").read_text() == "def add(a, b):\n    return a + b  \n"
    assert len(samples) == 1
    (s,) = samples
    _every_turn_trained(samples)
    assert [e["tools"] for e in s.metadata["ledger"]] == [
        ["exec_command"],
        ["apply_patch"],
        ["exec_command"],
        [],
    ]
    assert s.tokens == replies.prompts[-1] + replies.outputs[-1]
