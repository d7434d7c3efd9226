"""Assistant prefill through the adapter: the model continues the partial message, the harness
gets the continuation, the tree records the whole message, and only sampled tokens train. An
empty prefill (hermes-agent's, after a reply that was all reasoning) is no prefill."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import openai
import pytest

from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.ledger import Ledger
from tokentrail.trajectory.linearize import Trajectory

SCRIPT = [[{"type": "text", "text": " world."}], [{"type": "text", "text": "Again."}]]
USER = {"role": "user", "content": "Say hello."}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


class Recording(ScriptedEngine):
    """The scripted engine, keeping the prompt ids of every call."""

    def __init__(self, tokenizer, script) -> None:
        super().__init__(tokenizer, script)
        self.prompts: list[list[int]] = []

    async def generate(self, req):
        self.prompts.append([int(x) for x in req.input_ids])
        return await super().generate(req)


def session(
    tokenizer,
    turns: Callable[[str], Awaitable[Any]],
    script: list = SCRIPT,
    config: AdapterConfig | None = None,
) -> tuple[Recording, Any, Any]:
    engine = Recording(tokenizer, script)
    adapter = Adapter(engine=engine, tokenizer=tokenizer, config=config or AdapterConfig())

    async def go() -> tuple[Any, Any]:
        runner, url = await start_server(adapter)
        try:
            out = await turns(url)
            if adapter.sessions.get("s") is None and not adapter.manager.has_session("s"):
                # Every request was refused: the session was never opened.
                return out, Trajectory([], Ledger())
            return out, await adapter.finish_trajectory("s", reward=1.0)
        finally:
            await runner.cleanup()

    out, trajectory = asyncio.run(go())
    return engine, out, trajectory


def test_an_anthropic_prefill_is_continued_not_closed(tokenizer) -> None:
    async def turns(url: str) -> Any:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
        return await client.messages.create(
            model="m",
            max_tokens=64,
            messages=[USER, {"role": "assistant", "content": "Hello"}],
        )

    engine, reply, trajectory = session(tokenizer, turns)
    prompt = tokenizer.decode(engine.prompts[0])
    assert prompt.endswith("<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\nHello")
    # As the Messages API answers a prefill: the continuation only.
    assert [b.text for b in reply.content] == [" world."]
    (sample,) = trajectory.samples
    response = sample.tokens[-sample.response_length :]
    trained = [int(t) for t, m in zip(response, sample.loss_mask, strict=True) if m]
    assert tokenizer.decode(trained) == " world.<|im_end|>"
    assert tokenizer.decode(sample.tokens).endswith("assistant\nHello world.<|im_end|>")
    ledger = trajectory.ledger
    assert ledger.trained_tokens == ledger.generated_tokens == len(trained)
    leaf = trajectory.samples[0].metadata
    assert leaf["turns"] == [1]


READ = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
}


@pytest.mark.parametrize(
    ("prefill", "script"),
    [
        ("Hello", [{"type": "text", "text": " world."}]),
        # The prefill's trailing newline is one a call start would strip: the parser holds it.
        ("I will read it.\n", [{"type": "text", "text": "Reading:"}]),
        (
            "Let me",
            [
                {"type": "text", "text": " look."},
                {"type": "tool_use", "name": "Read", "input": {"file_path": "a.py"}},
            ],
        ),
    ],
    ids=["text", "held-newline", "text-then-call"],
)
def test_a_prefill_streams_its_continuation_as_sampled(
    tokenizer, prefill: str, script: list
) -> None:
    # The live reply (`--engine-stream`) of a prefill: the deltas hold the continuation alone,
    # and the streamed message is the one the whole reply gives.
    async def turns(url: str) -> Any:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
        messages = [USER, {"role": "assistant", "content": prefill}]
        async with client.messages.stream(
            model="m", max_tokens=64, tools=[READ], messages=messages
        ) as stream:
            deltas = [e.text async for e in stream if e.type == "text"]
            return deltas, await stream.get_final_message()

    def blocks(message: Any) -> list[Any]:
        return [
            (b.type, getattr(b, "text", None), getattr(b, "input", None)) for b in message.content
        ]

    live = AdapterConfig(live_stream=True)
    _, (deltas, streamed), trajectory = session(tokenizer, turns, [script], config=live)
    _, (_, whole), _ = session(tokenizer, turns, [script])
    assert blocks(streamed) == blocks(whole)
    assert "".join(deltas) == streamed.content[0].text == script[0]["text"]
    assert trajectory.ledger.trained_tokens == trajectory.ledger.generated_tokens > 0


def test_the_next_turn_builds_on_prefill_and_continuation(tokenizer) -> None:
    async def turns(url: str) -> Any:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
        first = await client.messages.create(
            model="m", max_tokens=64, messages=[USER, {"role": "assistant", "content": "Hello"}]
        )
        whole = "Hello" + first.content[0].text
        return await client.messages.create(
            model="m",
            max_tokens=64,
            messages=[
                USER,
                {"role": "assistant", "content": whole},
                {"role": "user", "content": "Once more."},
            ],
        )

    _, reply, trajectory = session(tokenizer, turns)
    assert reply.content[0].text == "Again."
    (sample,) = trajectory.samples
    assert sample.metadata["turns"] == [1, 2]
    assert trajectory.ledger.trained_tokens == trajectory.ledger.generated_tokens
    assert trajectory.drift_counts == {"clean": 1}


@pytest.mark.parametrize(
    "trailing",
    [
        pytest.param([{"role": "assistant", "content": ""}], id="empty"),
        pytest.param([{"role": "assistant", "content": " \n"}], id="whitespace"),
        pytest.param([{"role": "assistant", "content": ""}] * 2, id="two-empty-hermes"),
    ],
)
def test_an_empty_prefill_is_no_prefill(tokenizer, trailing: list[dict]) -> None:
    async def turns(url: str) -> Any:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="s", max_retries=0)
        plain = await client.chat.completions.create(model="m", messages=[USER])
        again = await client.chat.completions.create(model="m", messages=[USER, *trailing])
        return plain, again

    engine, (plain, again), trajectory = session(tokenizer, turns)
    # The same prompt ids as without it (no closed empty assistant turn is rendered), so the
    # second request is a retry of the first, answered from the record.
    assert len(engine.prompts) == 1
    assert [t.retries for t in trajectory.ledger.turns] == [1]
    assert tokenizer.decode(engine.prompts[0]).endswith(
        "Say hello.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert again.choices[0].message.content == plain.choices[0].message.content == " world."
    assert trajectory.ledger.trained_tokens == trajectory.ledger.generated_tokens


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        pytest.param(
            [{"role": "assistant", "content": "Hi"}],
            "no messages before the assistant prefill",
            id="prefill-only",
        ),
        pytest.param(
            [{"role": "assistant", "content": ""}], "no messages to render", id="empty-only"
        ),
    ],
)
def test_nothing_to_record_is_refused_before_generating(
    tokenizer, messages: list, match: str
) -> None:
    async def turns(url: str) -> Any:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="s", max_retries=0)
        with pytest.raises(openai.BadRequestError, match=match):
            await client.chat.completions.create(model="m", messages=messages)

    engine, _, trajectory = session(tokenizer, turns)
    assert engine.prompts == []
    assert trajectory.ledger.turns == []


def test_a_prefill_with_tool_calls_is_refused(tokenizer) -> None:
    async def turns(url: str) -> Any:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
        call = {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}
        with pytest.raises(anthropic.BadRequestError, match="send the tool results"):
            await client.messages.create(
                model="m", max_tokens=8, messages=[USER, {"role": "assistant", "content": [call]}]
            )

    engine, _, _ = session(tokenizer, turns)
    assert engine.prompts == []
