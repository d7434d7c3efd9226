"""The trainer-agnostic part of the integrations: a session hosted in the caller's event loop,
played by a harness command line (a child process speaking through the official anthropic
SDK) or by the simulated harness; a failing harness drops its session; the trainers are never
imported by `tokentrail` itself."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.errors import HarnessFailed
from tokentrail.integrations.session import (
    CommandHarness,
    SessionHost,
    SimulatedHarness,
    main_sample,
    prompt_text,
)
from tokentrail.sim.harness import SessionSpec
from tokentrail.text.tokenizer import load_tokenizer

# A harness CLI in miniature: the official SDK, configured only from the environment the
# integration gives its child.
SDK_CHILD = """
import anthropic, sys
client = anthropic.Anthropic()  # ANTHROPIC_BASE_URL, ANTHROPIC_AUTH_TOKEN
reply = client.messages.create(model="m", max_tokens=64,
                               messages=[{"role": "user", "content": sys.argv[1]}])
print("".join(b.text for b in reply.content if b.type == "text"))
"""


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin:qwen3")


def test_a_command_harness_session_becomes_a_sample(tokenizer) -> None:
    harness = CommandHarness([sys.executable, "-c", SDK_CHILD, "{prompt}"], timeout_s=120)

    async def go():
        async with SessionHost(ScriptedEngine(tokenizer), tokenizer) as host:
            return await host.run(harness, "Say hello.", session_id="cmd-1")

    run = asyncio.run(go())
    assert run.session_id == "cmd-1"
    sample = main_sample(run.trajectory)
    ledger = run.trajectory.ledger
    assert len(ledger.turns) == 1
    assert sample.trained_tokens == ledger.trained_tokens == ledger.generated_tokens > 0
    # What the child printed is the reply whose tokens the sample trains.
    trained = sample.tokens[sample.prompt_length :][sample.loss_mask.astype(bool)]
    assert run.harness_result.strip()
    assert run.harness_result.strip() in tokenizer.tokenizer.decode(trained.tolist())


def test_a_failing_harness_drops_its_session(tokenizer) -> None:
    harness = CommandHarness([sys.executable, "-c", "import sys; sys.exit(3)"])

    async def go():
        async with SessionHost(ScriptedEngine(tokenizer), tokenizer) as host:
            with pytest.raises(HarnessFailed, match="exited 3"):
                await host.run(harness, "x", session_id="bad-1")
            assert host.adapter.sessions.open_ids() == []
            assert not host.adapter.manager.has_session("bad-1")
            # The host still serves the next session.
            spec = SessionSpec(steps=2, context_tokens=300, think=0.0, files=1)
            return await host.run(SimulatedHarness(spec=spec), "Fix calc.py.")

    run = asyncio.run(go())
    assert len(run.trajectory.ledger.turns) >= 2


def test_prompt_text_takes_the_last_user_message() -> None:
    chat = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "fix "}, {"type": "text", "text": "it"}],
        },
        {"role": "assistant", "content": "ok"},
    ]
    assert prompt_text(chat) == "fix it"
    assert prompt_text("plain") == "plain"
    with pytest.raises(HarnessFailed):
        prompt_text([{"role": "system", "content": "no task"}])


def test_tokentrail_does_not_import_the_trainers() -> None:
    code = (
        "import sys, tokentrail, tokentrail.integrations.session, tokentrail.integrations.trl;"
        "assert not {'trl', 'verl'} & set(sys.modules), sorted({'trl', 'verl'} & set(sys.modules))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
