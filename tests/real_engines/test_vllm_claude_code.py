"""A real Claude Code session (its quiet configuration) through `tokentrail serve` on a real
vLLM (CPU build) serving the tiny Qwen3: every trained token's logprob is the one vLLM answered,
every generated token is trained, and the recompute audit passes over the whole session. A
random model never ends a reply, so the replies are bounded by Claude Code's own
`CLAUDE_CODE_MAX_OUTPUT_TOKENS` (its default asks for 32,000 tokens a turn).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.claude_code import install_claude_code, run_claude
from support.real_sessions import assert_recorded_as_answered, finished_samples, require_npm
from support.serve import Served, serving
from support.vllm_server import Recording, VLLMServer, recording
from tokentrail.model.forward import CausalLM

MODEL = "qwen3"
MAX_OUTPUT_TOKENS = "256"


@pytest.fixture(scope="module")
def vllm(vllm_servers) -> VLLMServer:
    return vllm_servers.get(MODEL)


@pytest.fixture(scope="module")
def proxy(vllm: VLLMServer) -> Iterator[Recording]:
    with recording(vllm.url) as rec:
        yield rec


@pytest.fixture(scope="module")
def served(vllm: VLLMServer, proxy: Recording) -> Iterator[Served]:
    engine = "vllm://" + proxy.url.removeprefix("http://")
    with serving(Path(), "--tokenizer", str(vllm.model_dir), engine=engine) as adapter:
        yield adapter


def test_a_claude_code_session_on_vllm(served: Served, proxy: Recording, vllm, tmp_path) -> None:
    require_npm("Claude Code")
    exe = install_claude_code()
    assert exe is not None
    work = tmp_path / "work"
    work.mkdir()
    since = len(proxy.exchanges)
    run = run_claude(
        exe,
        "Say hi.",
        base_url=served.url,
        session_id="cc-vllm",
        cwd=work,
        timeout=300,
        env={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": MAX_OUTPUT_TOKENS},
    )
    # A random model never ends a reply: Claude Code asks it to go on after each cut, then
    # gives up with its own error, as it does with any model that runs past its limit.
    (result,) = [e for e in run.events if e.get("type") == "result"]
    assert run.returncode == 1 and result["is_error"], result
    assert result["result"].startswith(
        f"API Error: Claude's response exceeded the {MAX_OUTPUT_TOKENS} output token maximum"
    )
    samples, ledger = finished_samples(served, "cc-vllm")
    print(json.dumps({k: v for k, v in ledger.items() if k not in ("turns", "by_tool")}))
    # Every turn it sent is recorded, cut at the limit, spliced into one sample and trained.
    assert ledger["length_truncated_turns"] == len(ledger["turns"]) >= 2
    assert ledger["generated_tokens"] == int(MAX_OUTPUT_TOKENS) * len(ledger["turns"])
    assert ledger["trained_tokens"] == ledger["generated_tokens"]
    # Claude Code's whole first prompt: its system prompt and tool schemas.
    assert max(len(s.tokens) for s in samples) > 10000
    assert served.resume_checks()["mismatch"] == 0
    assert_recorded_as_answered(samples, ledger, proxy, since, CausalLM(vllm.model_dir))
