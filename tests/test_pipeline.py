"""The one turn pipeline, driven directly: the order of its stages, what each reports, its
timing, and the recorded-prompt path that recovery and `replay` take."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from tokentrail import (
    Conversation,
    Fallback,
    History,
    RequestError,
    Restore,
    Stage,
    TrajectoryManager,
    TurnPipeline,
)
from tokentrail.errors import PolicyError
from tokentrail.text.parsing import format_output
from tokentrail.trajectory.pipeline import RecordedPrompt, TurnTiming

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Edit",
            "parameters": {
                "type": "object",
                "properties": {
                    "file_path": {"type": "string"},
                    "new_string": {"type": "string"},
                    "replace_all": {"type": "boolean", "default": False},
                },
            },
        },
    }
]
SYSTEM = {"role": "system", "content": "You edit files."}
USER = {"role": "user", "content": "Fix calc.py."}
EDIT = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "type": "function",
            "function": {
                "name": "Edit",
                "arguments": {"file_path": "calc.py", "new_string": "x = 1   \n"},
            },
        }
    ],
}
# What Claude Code sends back: the default filled in, trailing blanks stripped.
EDIT_ECHO = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "type": "function",
            "function": {
                "name": "Edit",
                "arguments": {
                    "replace_all": False,
                    "file_path": "calc.py",
                    "new_string": "x = 1\n",
                },
            },
        }
    ],
}


@dataclass
class Sampled:
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"
    routed_experts: None = None
    indexer_topk: None = None
    weight_versions: tuple[()] = ()
    discarded: tuple[()] = ()


def sample(tokenizer, message) -> Sampled:
    ids = tokenizer.encode(format_output(message)) + [tokenizer.eos_token_id]
    return Sampled(ids, [-0.25] * len(ids))


def test_a_second_turn_restores_the_echo_then_splices_onto_the_held_tokens(tokenizer) -> None:
    pipeline = TurnPipeline(TrajectoryManager(), tokenizer)
    first = pipeline.prepare("s", Conversation([SYSTEM, USER], TOOLS))
    assert first.history is History.RENDER and first.fallback is None
    out = sample(tokenizer, EDIT)
    parsed = pipeline.parse(first, out.output_ids)
    assert parsed.message == EDIT and not parsed.ill_formed
    assert pipeline.record(first, out, parsed.message) == 1

    second = pipeline.prepare(
        "s", Conversation([SYSTEM, USER, EDIT_ECHO, {"role": "tool", "content": "ok"}], TOOLS)
    )
    assert second.restored_tools == ["Edit"]
    assert second.messages[2] == EDIT  # the generated message, not the echo
    assert second.history is History.SPLICE
    held = np.concatenate([first.prompt_ids, np.asarray(out.output_ids, np.uint32)])
    assert np.array_equal(second.prompt_ids[: len(held)], held)
    # The spliced prompt is the full render's tokens (this template is prefix-preserving).
    full = tokenizer.encode(pipeline.render(second.messages, TOOLS))
    assert second.prompt_ids.tolist() == full


def test_stages_are_timed_in_order_and_overhead_leaves_out_the_engine(tokenizer) -> None:
    pipeline = TurnPipeline(TrajectoryManager(), tokenizer)
    timing = TurnTiming()
    timing.lap(Stage.TRANSLATE)
    prepared = pipeline.prepare("s", Conversation([SYSTEM, USER], TOOLS), timing=timing)
    timing.stages[Stage.ENGINE] = 0.9  # a slow engine
    timing.engine_reported = 0.85
    pipeline.parse(prepared, sample(tokenizer, EDIT).output_ids)
    assert list(timing.stages) == [
        Stage.TRANSLATE,
        Stage.RESTORE,
        Stage.RENDER,
        Stage.TOKENIZE,
        Stage.ENGINE,
        Stage.PARSE,
    ]
    adapter_time = sum(v for k, v in timing.stages.items() if k is not Stage.ENGINE)
    assert timing.overhead == pytest.approx(adapter_time)
    assert timing.overhead < 0.5  # neither the engine's time nor what it reported


def test_a_conversation_with_no_messages_is_refused_before_any_engine_call(tokenizer) -> None:
    pipeline = TurnPipeline(TrajectoryManager(), tokenizer)
    with pytest.raises(RequestError, match="no messages"):
        pipeline.prepare("s", Conversation([], None))
    with pytest.raises(RequestError, match="no messages"):
        pipeline.count_tokens(Conversation([], None))


def test_a_recorded_prompt_is_used_as_it_is_and_keeps_its_history(tokenizer) -> None:
    live = TurnPipeline(TrajectoryManager(), tokenizer)
    first = live.prepare("s", Conversation([SYSTEM, USER], TOOLS))
    # Recovery without a tokenizer: the journal's ids, restore still run.
    replayed = TurnPipeline(TrajectoryManager(), None)
    recorded = RecordedPrompt(first.prompt_ids, History.RENDER, Fallback.TAIL_MISMATCH)
    again = replayed.prepare("s", Conversation([SYSTEM, USER], TOOLS), recorded=recorded)
    assert np.array_equal(again.prompt_ids, first.prompt_ids)
    assert (again.history, again.fallback) == (History.RENDER, Fallback.TAIL_MISMATCH)
    replayed.record(again, sample(tokenizer, EDIT), EDIT)
    ledger = replayed.manager.finish("s").ledger
    assert ledger.turns[0].to_dict()["history"] == "splice_fallback:tail_mismatch"
    assert ledger.splice_fallbacks == {"tail_mismatch": 1}
    with pytest.raises(PolicyError, match="no tokenizer"):
        replayed.prepare("t", Conversation([SYSTEM, USER], TOOLS))


def test_restore_modes_decide_what_is_rendered_and_what_is_recorded(tokenizer) -> None:
    for mode, rendered_echo, recorded_echo in (
        (Restore.ON, EDIT, EDIT),
        (Restore.TREE_ONLY, EDIT_ECHO, EDIT),
        (Restore.OFF, EDIT_ECHO, EDIT_ECHO),
    ):
        pipeline = TurnPipeline(TrajectoryManager(), tokenizer, restore=mode)
        first = pipeline.prepare("s", Conversation([SYSTEM, USER], TOOLS))
        pipeline.record(first, sample(tokenizer, EDIT), EDIT)
        turn = pipeline.restored("s", Conversation([SYSTEM, USER, EDIT_ECHO, USER], TOOLS))
        assert (turn.render[2], turn.record[2]) == (rendered_echo, recorded_echo), mode


def test_periodic_splice_checks_run_after_the_turn_and_back_off(tokenizer) -> None:
    pipeline = TurnPipeline(TrajectoryManager(), tokenizer, splice_verify_every=2)
    messages = [SYSTEM, USER]
    ran = []
    for k in range(20):
        turn = pipeline.prepare("s", Conversation(list(messages), TOOLS))
        assert turn.fallback is None
        call = {**EDIT, "content": f"Step {k}."}
        out = sample(tokenizer, call)
        pipeline.record(turn, out, pipeline.parse(turn, out.output_ids).message)
        messages += [call, {"role": "tool", "content": f"ok {k}"}]
        waits = pipeline.splice_check_waits("s")
        ran.append(pipeline.check_splice("s") if waits else None)
    passed = [k for k, r in enumerate(ran) if r is True]
    assert False not in ran and len(passed) >= 2
    # The period doubles each time a check passes: 2 splices, then 4, then 8.
    assert [b - a for a, b in zip(passed, passed[1:], strict=False)][:2] == [4, 8]


def test_a_failed_deferred_check_makes_the_next_turn_a_recorded_full_render(
    tokenizer, monkeypatch
) -> None:
    pipeline = TurnPipeline(TrajectoryManager(), tokenizer, splice_verify_every=2)
    prompts = pipeline.prompts
    real = prompts.render
    messages = [SYSTEM, USER]
    for k in range(8):
        turn = pipeline.prepare("s", Conversation(list(messages), TOOLS))
        call = {**EDIT, "content": f"Step {k}."}
        out = sample(tokenizer, call)
        pipeline.record(turn, out, pipeline.parse(turn, out.output_ids).message)
        messages += [call, {"role": "tool", "content": f"ok {k}"}]
        if pipeline.splice_check_waits("s"):
            break
    else:
        pytest.fail("no splice check was deferred")
    # The full render now disagrees with the splice (as a template with hidden state would).
    monkeypatch.setattr(prompts, "render", lambda m, t: real(m, t) + "drift")
    assert pipeline.check_splice("s") is False
    monkeypatch.setattr(prompts, "render", real)
    nxt = pipeline.prepare("s", Conversation(list(messages), TOOLS))
    assert nxt.history is History.RENDER and nxt.fallback is Fallback.TAIL_MISMATCH
    full = tokenizer.encode(pipeline.render(nxt.messages, TOOLS))
    assert nxt.prompt_ids.tolist() == full
