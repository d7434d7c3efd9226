"""The harness simulators do what each behaviour switch says, reproducibly."""

from __future__ import annotations

import asyncio

import pytest

from tokentrail.sim.harness import NUDGE, Behaviour, SessionSpec, rerender_tool_input, simulate
from tokentrail.text.tokenizer import load_tokenizer

PLAIN = Behaviour(rerender_echoes=False, move_cache_control=False, system_notes=False)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def play(tokenizer, behaviour: Behaviour, **spec):
    return asyncio.run(simulate(tokenizer, behaviour=behaviour, spec=SessionSpec(**spec)))


def without_ids(messages) -> list:
    return [
        {
            **m,
            "content": [
                {k: v for k, v in b.items() if k not in ("id", "tool_use_id")} for b in m["content"]
            ],
        }
        if isinstance(m["content"], list)
        else m
        for m in messages
    ]


def roles(messages) -> list[str]:
    return [m["role"] for m in messages]


def test_sessions_are_reproducible_from_a_seed(tokenizer) -> None:
    a = play(tokenizer, Behaviour(), seed=5, steps=5)
    b = play(tokenizer, Behaviour(), seed=5, steps=5)
    c = play(tokenizer, Behaviour(), seed=6, steps=5)
    assert without_ids(a.result.messages) == without_ids(b.result.messages)
    assert without_ids(a.result.messages) != without_ids(c.result.messages)
    # Tool-call ids are minted per response and never rendered: the tokens are identical.
    assert a.trajectory.samples[0].tokens.tolist() == b.trajectory.samples[0].tokens.tolist()
    assert a.result.requests == 6  # five tool calls, then the answer


def test_context_size_follows_the_spec(tokenizer) -> None:
    small = play(tokenizer, PLAIN, seed=1, steps=6, context_tokens=500)
    large = play(tokenizer, PLAIN, seed=1, steps=6, context_tokens=8000)
    assert len(large.trajectory.samples[0].tokens) > 3 * len(small.trajectory.samples[0].tokens)


def test_claude_code_echo_rerendering() -> None:
    from tokentrail.sim.harness import CLAUDE_CODE_TOOLS

    edit = rerender_tool_input(
        "Edit",
        {"file_path": "a", "old_string": "x  \n", "new_string": "y  \nz\t\n"},
        CLAUDE_CODE_TOOLS,
    )
    assert list(edit) == ["replace_all", "file_path", "old_string", "new_string"]
    assert edit["replace_all"] is False and edit["new_string"] == "y\nz\n"
    assert edit["old_string"] == "x  \n"
    md = rerender_tool_input("Write", {"file_path": "n.md", "content": "a  \n"}, CLAUDE_CODE_TOOLS)
    assert md["content"] == "a  \n"


def test_verify_on_stop_strips_the_nudge_and_merges(tokenizer) -> None:
    kept = play(tokenizer, Behaviour(verify_on_stop=True), seed=2, steps=2)
    assert roles(kept.result.messages)[-3:] == ["assistant", "user", "assistant"]
    assert kept.result.messages[-2]["content"][0]["text"] == NUDGE
    merged = play(tokenizer, Behaviour(verify_on_stop=True, strip_nudge=True), seed=2, steps=2)
    last = merged.result.messages[-1]
    assert roles(merged.result.messages)[-2:] == ["user", "assistant"]
    texts = [b["text"] for b in last["content"] if b["type"] == "text"]
    assert len(texts) == 2 and texts[1].startswith("Verified:")
    dropped = play(
        tokenizer,
        Behaviour(verify_on_stop=True, strip_nudge=True, drop_full_answer=True),
        seed=2,
        steps=2,
    )
    texts = [b["text"] for b in dropped.result.messages[-1]["content"] if b["type"] == "text"]
    assert len(texts) == 1 and texts[0].startswith("Verified:")


def test_system_nudge(tokenizer) -> None:
    run = play(tokenizer, Behaviour(verify_on_stop=True, nudge_role="system"), seed=2, steps=2)
    assert run.result.messages[-2] == {"role": "system", "content": NUDGE}


def test_subagents_compaction_and_retries(tokenizer) -> None:
    run = play(tokenizer, Behaviour(subagents=True, compaction=True, retries=True), seed=4, steps=6)
    assert run.result.subagent_runs == 1 and run.result.tool_calls["Agent"] == 1
    assert run.result.compactions == 1 and run.result.dropped_responses == 1
    first_user = run.result.messages[0]["content"][0]["text"]
    assert "[progress: 3 steps]" in first_user
    # The main line, the sub-agent's conversation, the pre-compaction history: the resent
    # request is answered with the reply it lost, so it adds no dead-end sample.
    assert len(run.trajectory.samples) == 3
    ledger = run.trajectory.ledger
    assert ledger.trained_tokens == ledger.generated_tokens and ledger.retries == 1


def test_a_retry_asking_for_a_fresh_sample_supersedes_the_first(tokenizer) -> None:
    run = play(tokenizer, Behaviour(retries=True, fresh_retries=True), seed=4, steps=3)
    ledger = run.trajectory.ledger
    (superseded,) = [t for t in ledger.turns if t.superseded]
    assert superseded.trained == 0 and superseded.masked == {"superseded": superseded.generated}
    assert ledger.trained_tokens == ledger.generated_tokens - superseded.generated
    assert len(run.trajectory.samples) == 1 and ledger.retries == 0


def test_reasoning_stripped_from_earlier_turns(tokenizer) -> None:
    from tokentrail.sim.harness import HarnessSim

    sim = HarnessSim("http://unused", "s", behaviour=Behaviour(strip_reasoning=True))
    history = [
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "a"}, {"type": "text", "text": "b"}],
        },
        {"role": "user", "content": [{"type": "text", "text": "more"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "c"}]},
    ]
    wire = sim._wire_messages(history)
    assert [b["type"] for b in wire[1]["content"]] == ["text"]
    assert [b["type"] for b in wire[3]["content"]] == ["thinking"]
