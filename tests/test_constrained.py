"""Forced tool calls: the grammar an engine samples them under, and what their tokens are in a
sample. An engine computes a constrained token's logprob after the grammar's mask, so each such
token is marked `constrained`, counted in the ledger, and masked as `constrained` unless the
policy trains it."""

from __future__ import annotations

import argparse
import asyncio
import random
import re
from typing import Any

import anthropic
import openai
import pytest

from support.fake_engines import IM_END, FakeSGLang, FakeVLLM
from tokentrail.adapter import Adapter, start_server
from tokentrail.cli.serve import ServeSettings
from tokentrail.cli.settings import add_arguments, resolve
from tokentrail.engines.sglang import SGLangEngine
from tokentrail.engines.vllm import VLLMEngine
from tokentrail.errors import PolicyError
from tokentrail.integrations.slime.sample import CompatSample
from tokentrail.integrations.slime.trajectory import slime_samples
from tokentrail.kinds import ConstrainedPolicy
from tokentrail.text.constraints import forced_tool_call, without
from tokentrail.text.families import family
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.sample import Sample

CALL = {"type": "function", "function": {"name": "Read", "arguments": {"file_path": "a.py"}}}
OTHER = {"type": "function", "function": {"name": "Write", "arguments": {}}}
TOOL_RESPONSE = 151665  # Qwen3's `<tool_response>`: the prompt holds a tool result
CALL_TEXT = '<tool_call>\n{"name": "Read", "arguments": {"file_path": "a.py"}}\n</tool_call>'
READ = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


# -- the grammar ----------------------------------------------------------------------------


def test_the_text_without_a_word_is_exactly_that() -> None:
    avoid = re.compile(without("</think>"))
    alphabet = "</thinka>\n"
    rng = random.Random(7)
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        assert bool(avoid.fullmatch(text)) == ("</think>" not in text), text


# (family, what its prompt ends with, whether the model writes the block's opening itself)
PROMPTS = [
    ("qwen3", "<|im_start|>assistant\n", True),
    ("qwen3.6", "<|im_start|>assistant\n<think>\n", False),
    ("nemotron3", "<|im_start|>assistant\n<think>\n", False),
]


@pytest.mark.parametrize(("name", "prompt_end", "model_opens"), PROMPTS)
def test_a_forced_call_follows_the_reasoning_block_at_once(name, prompt_end, model_opens) -> None:
    fam = family(name)
    forced = forced_tool_call(
        fam.tool_parser, ["Read"], reasoning=fam.reasoning_parser, prompt_end=prompt_end
    )

    def text(**message: Any) -> str:
        return fam.format_output({"role": "assistant", "content": "", **message})

    def ok(sampled: str) -> bool:
        return re.fullmatch(forced.regex, sampled) is not None

    # The family's own layout of a call, with reasoning and without.
    assert ok(text(reasoning_content="Read it first.", tool_calls=[CALL]))
    assert ok(text(reasoning_content="", tool_calls=[CALL]))
    assert ok(text(reasoning_content="two\n\nlines <think> </thin", tool_calls=[CALL, CALL]))
    # No call, another tool, text before the call: refused.
    assert not ok(text(reasoning_content="hm", content="No call."))
    assert not ok(text(reasoning_content="hm", tool_calls=[OTHER]))
    assert not ok(text(reasoning_content="hm", content="Sure.", tool_calls=[CALL]))
    # Wandering: text after the block closed, before the call, or a second close (the old
    # head let both through), or text before the block opens.
    good = text(reasoning_content="hm", tool_calls=[CALL])
    close = good.index("</think>") + len("</think>")
    assert not ok(good[:close] + "Let me call it." + good[close:])
    assert not ok(good[:close] + "more</think>\n\n" + good[close:])
    if model_opens:
        assert not ok("Hello " + good)
        # No block at all: the model may skip thinking.
        assert ok(text(tool_calls=[CALL]))
    else:
        # The prompt opened the block: the model must close it before the call.
        assert not ok(good[close:].lstrip("\n"))


def test_a_prompt_that_closed_the_block_gets_the_call_alone() -> None:
    closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    forced = forced_tool_call("hermes", ["Read"], reasoning="qwen3", prompt_end=closed)
    assert re.fullmatch(forced.regex, CALL_TEXT)
    assert not re.fullmatch(forced.regex, "<think>\nhm\n</think>\n\n" + CALL_TEXT)
    assert forced_tool_call("hermes", ["Read"], reasoning=None).regex == forced.regex


def test_the_pipeline_reads_the_prompt_end(tokenizer) -> None:
    """A served turn's constraint is built after its prompt ids, from how they end."""
    from tokentrail.kinds import ToolChoice
    from tokentrail.messages import Conversation
    from tokentrail.trajectory.pipeline import TurnPipeline

    pipeline = TurnPipeline(TrajectoryManager(), tokenizer)
    tools = [{"type": "function", "function": {"name": "Read", "parameters": {}}}]
    conversation = Conversation(
        [{"role": "user", "content": "go"}], tools, tool_choice=ToolChoice.REQUIRED
    )
    prepared = pipeline.prepare("s", conversation)
    assert prepared.constraint is not None
    assert (
        prepared.constraint.regex
        == forced_tool_call(
            "hermes", ["Read"], reasoning="qwen3", prompt_end="<|im_start|>assistant\n"
        ).regex
    )
    assert prepared.tags.constrained and prepared.tags.as_metadata()["constrained"] is True


# -- a forced call's tokens in a session ----------------------------------------------------


def reply_for(tokenizer):
    """A call to Read for a prompt without a tool result, then a short answer."""
    call = [*tokenizer.encode(CALL_TEXT), IM_END]
    done = [*tokenizer.encode("Done."), IM_END]

    def reply(input_ids: list[int]) -> tuple[list[int], list[float], str]:
        ids = done if TOOL_RESPONSE in input_ids else call
        return list(ids), [-0.25] * len(ids), "stop"

    return reply


ENGINES = ["vllm", "sglang"]


def forced_session(tokenizer, kind: str, manager: TrajectoryManager) -> tuple[Any, Any]:
    """Two turns through the adapter over a stand-in engine: a forced call (OpenAI `required`
    for vLLM, Anthropic `tool` for SGLang), then an answer to its result; the trajectory and
    the engine's request bodies."""

    async def go() -> tuple[Any, Any]:
        server = (
            FakeVLLM(reply_for(tokenizer)) if kind == "vllm" else FakeSGLang(reply_for(tokenizer))
        )
        async with server as srv:
            engine: Any = (
                VLLMEngine(srv.url, tokenizer, model="m")
                if kind == "vllm"
                else SGLangEngine(srv.url, tokenizer)
            )
            adapter = Adapter(engine=engine, tokenizer=tokenizer, manager=manager)
            runner, url = await start_server(adapter)
            try:
                if kind == "vllm":
                    await openai_turns(url)
                else:
                    await anthropic_turns(url)
                trajectory = await adapter.finish_trajectory("s")
            finally:
                await runner.cleanup()
            path = "/v1/completions" if kind == "vllm" else "/generate"
            return trajectory, srv.bodies(path)

    return asyncio.run(go())


async def openai_turns(url: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="s", max_retries=0)
    tools = [{"type": "function", "function": {"name": "Read", "parameters": READ["input_schema"]}}]
    messages: list[Any] = [{"role": "user", "content": "Read a.py"}]
    first = await client.chat.completions.create(
        model="m", messages=messages, tools=tools, tool_choice="required"
    )
    (call,) = first.choices[0].message.tool_calls or []
    assert call.function.name == "Read"
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "print(1)"},
    ]
    second = await client.chat.completions.create(model="m", messages=messages, tools=tools)
    assert second.choices[0].message.content == "Done."


async def anthropic_turns(url: str) -> None:
    client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Read a.py"}]
    first = await client.messages.create(
        model="m",
        max_tokens=256,
        tools=[READ],
        tool_choice={"type": "tool", "name": "Read"},
        messages=messages,
    )
    (call,) = [b for b in first.content if b.type == "tool_use"]
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "print(1)"}],
        },
    ]
    second = await client.messages.create(
        model="m", max_tokens=256, tools=[READ], messages=messages
    )
    assert second.content[0].text == "Done."


def constraint_of(body: dict[str, Any], kind: str) -> str:
    return (
        body["structured_outputs"]["regex"] if kind == "vllm" else body["sampling_params"]["regex"]
    )


@pytest.mark.parametrize("kind", ENGINES)
def test_a_forced_call_is_marked_counted_and_masked(tokenizer, kind) -> None:
    trajectory, bodies = forced_session(tokenizer, kind, TrajectoryManager())
    # The first request was sampled under the grammar, and what came back satisfies it; the
    # second was not constrained.
    regex = constraint_of(bodies[0], kind)
    assert re.fullmatch(regex, CALL_TEXT)
    assert "structured_outputs" not in bodies[1] and "regex" not in bodies[1].get(
        "sampling_params", {}
    )
    call_len = len(tokenizer.encode(CALL_TEXT)) + 1
    ledger = trajectory.ledger
    first, second = ledger.turns
    assert (first.constrained, second.constrained) == (call_len, 0)
    assert first.trained == 0 and first.masked == {"constrained": call_len}
    assert second.trained == second.generated and second.masked == {}
    assert ledger.constrained_tokens == call_len
    assert ledger.to_dict()["constrained_tokens"] == call_len
    assert ledger.masked_tokens == {"constrained": call_len}
    assert ledger.trained_tokens + call_len == ledger.generated_tokens
    (sample,) = trajectory.samples
    # The call's tokens are marked where they sit in the response; none of them trains.
    mask = sample.constrained
    (start,) = [p.start for p in trajectory.placements[0] if p.turn_index == 1]
    at = start - sample.prompt_length
    assert mask.tolist() == [0] * at + [1] * call_len + [0] * (len(mask) - at - call_len)
    assert not sample.loss_mask[mask == 1].any()
    assert sample.loss_mask[at + call_len :].any()
    assert sample.metadata["constrained"] == [[at, at + call_len]]
    assert sample.metadata["constrained_tokens"] == call_len
    # As a trainer receives it: the dict, the torch tensors, and slime's sample.
    again = Sample.from_dict(sample.to_dict())
    assert again.constrained.tolist() == mask.tolist()
    (slime,) = slime_samples(trajectory, CompatSample(index=0))
    assert slime.metadata["constrained"] == [[at, at + call_len]]
    assert slime.metadata["ledger"][0]["masked"] == {"constrained": call_len}


@pytest.mark.parametrize("kind", ENGINES)
def test_the_yes_policy_trains_the_constrained_tokens(tokenizer, kind) -> None:
    trajectory, _ = forced_session(tokenizer, kind, TrajectoryManager(train_constrained="yes"))
    ledger = trajectory.ledger
    assert ledger.masked_tokens == {} and ledger.trained_tokens == ledger.generated_tokens
    # Still marked: a trainer can tell them apart.
    first = ledger.turns[0]
    assert first.constrained == first.generated == first.trained
    (sample,) = trajectory.samples
    assert sample.constrained.sum() == first.constrained
    assert sample.loss_mask[sample.constrained == 1].all()


def test_the_policy_is_a_serve_setting(tokenizer) -> None:
    assert ServeSettings().manager.train_constrained is ConstrainedPolicy.MASK
    parser = argparse.ArgumentParser()
    add_arguments(parser, ServeSettings)
    resolved = resolve(ServeSettings, parser.parse_args(["--train-constrained", "yes"]), {})
    assert resolved.build(ServeSettings).manager.train_constrained is ConstrainedPolicy.YES
    with pytest.raises(PolicyError, match="expected one of \\('mask', 'yes'\\)"):
        TrajectoryManager(train_constrained="sometimes")
