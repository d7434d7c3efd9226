"""What the adapter answers for request options the official SDKs send: `tool_choice`, `n`,
`logprobs`, server tools and media; what a turn's sample and ledger record of them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from support.fake_engines import FakeSGLang
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.engines.sglang import SGLangEngine
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.ledger import Ledger
from tokentrail.trajectory.linearize import Trajectory

READ = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
}
CALL = [{"type": "tool_use", "name": "Read", "input": {"file_path": "a.py"}}]
TEXT = [{"type": "text", "text": 'Plain text. <tool_call>\n{"name": "Read", "arguments": {}}'}]
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def serve(
    tokenizer, script: list, turns: Callable[[str], Awaitable[Any]], engine: Any = None
) -> tuple[Any, Any, str]:
    adapter = Adapter(
        engine=engine or ScriptedEngine(tokenizer, script),
        tokenizer=tokenizer,
        config=AdapterConfig(),
    )

    async def go() -> tuple[Any, Any, str]:
        runner, url = await start_server(adapter)
        try:
            out = await turns(url)
            # A session whose every request was refused was never opened: it has no turns.
            has = adapter.sessions.get("s") is not None or adapter.manager.has_session("s")
            trajectory = await adapter.finish_trajectory("s") if has else Trajectory([], Ledger())
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{url}/metrics") as resp:
                    metrics = await resp.text()
            return out, trajectory, metrics
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def claude(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)


def oai(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="s", max_retries=0)


# --- tool_choice ------------------------------------------------------------------------------


def test_a_forced_tool_choice_is_sampled_under_a_constraint(tokenizer) -> None:
    async def turns(url: str) -> Any:
        return await claude(url).messages.create(
            model="m",
            max_tokens=256,
            tools=[READ],
            tool_choice={"type": "tool", "name": "Read"},
            messages=HI,
        )

    reply, trajectory, _ = serve(tokenizer, [CALL], turns)
    assert reply.stop_reason == "tool_use" and reply.content[0].name == "Read"
    assert trajectory.samples[0].metadata["turns"] == [1]


def test_a_forced_tool_choice_the_engine_cannot_honour_is_a_400(tokenizer) -> None:
    async def turns(url: str) -> Any:
        with pytest.raises(anthropic.BadRequestError, match="cannot constrain it: reply 0"):
            await claude(url).messages.create(
                model="m", max_tokens=256, tools=[READ], tool_choice={"type": "any"}, messages=HI
            )

    _, trajectory, _ = serve(tokenizer, [TEXT], turns)
    assert trajectory.ledger.turns == []


def test_sglang_gets_the_forced_call_as_a_regex(tokenizer) -> None:
    async def body() -> dict[str, Any]:
        async with FakeSGLang() as srv:
            engine = SGLangEngine(srv.url, tokenizer)

            async def turns(url: str) -> Any:
                return await oai(url).chat.completions.create(
                    model="m",
                    messages=HI,
                    tools=[
                        {
                            "type": "function",
                            "function": {"name": "Read", "parameters": READ["input_schema"]},
                        }
                    ],
                    tool_choice="required",
                )

            adapter = Adapter(engine=engine, tokenizer=tokenizer)
            runner, url = await start_server(adapter)
            try:
                await turns(url)
            finally:
                await runner.cleanup()
            return srv.bodies("/generate")[0]["sampling_params"]

    params = asyncio.run(body())
    assert '"name": "(?:Read)"' in params["regex"]


def test_tool_choice_none_leaves_call_markup_as_text(tokenizer) -> None:
    async def turns(url: str) -> Any:
        return await claude(url).messages.create(
            model="m", max_tokens=256, tools=[READ], tool_choice={"type": "none"}, messages=HI
        )

    reply, trajectory, _ = serve(tokenizer, [CALL], turns)
    assert [b.type for b in reply.content] == ["text"]
    assert reply.content[0].text.startswith("<tool_call>")
    assert reply.stop_reason == "end_turn"
    assert trajectory.samples[0].metadata["use_tool"] is False


# --- n and logprobs ---------------------------------------------------------------------------


def test_n_above_one_is_refused(tokenizer) -> None:
    async def turns(url: str) -> Any:
        with pytest.raises(openai.BadRequestError, match="n=2: tokentrail samples one choice"):
            await oai(url).chat.completions.create(model="m", messages=HI, n=2)

    _, trajectory, _ = serve(tokenizer, [TEXT], turns)
    assert trajectory.ledger.turns == []


@pytest.mark.parametrize("stream", [False, True])
def test_openai_logprobs_are_the_sampled_ones(tokenizer, stream: bool) -> None:
    script = [[{"type": "text", "text": "Hello there."}]]

    async def turns(url: str) -> Any:
        client = oai(url)
        kwargs: dict[str, Any] = dict(model="m", messages=HI, logprobs=True, top_logprobs=2)
        if not stream:
            return (await client.chat.completions.create(**kwargs)).choices[0].logprobs
        events = await client.chat.completions.create(stream=True, **kwargs)
        content = []
        async for chunk in events:
            if chunk.choices and chunk.choices[0].logprobs:
                content += chunk.choices[0].logprobs.content or []
        return type("L", (), {"content": content})

    logprobs, trajectory, _ = serve(tokenizer, script, turns)
    (sample,) = trajectory.samples
    # The reply's tokens are the sampled ones without the end token, logprob for logprob.
    sampled = sample.rollout_log_probs[-sample.response_length :]
    assert "".join(t.token for t in logprobs.content) == "Hello there."
    assert [t.logprob for t in logprobs.content] == pytest.approx(list(sampled[:-1]))
    assert all(t.top_logprobs == [] for t in logprobs.content)


# --- server tools and media, as the sample and the ledger record them -------------------------


def test_withheld_tools_and_dropped_media_are_recorded(tokenizer) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}

    async def turns(url: str) -> Any:
        return await claude(url).messages.create(
            model="m",
            max_tokens=64,
            tools=[READ, {"type": "web_search_20250305", "name": "web_search"}],
            messages=[{"role": "user", "content": [{"type": "text", "text": "see"}, image]}],
        )

    _, trajectory, metrics = serve(tokenizer, [[{"type": "text", "text": "ok"}]], turns)
    (sample,) = trajectory.samples
    assert sample.metadata["withheld_tools"] == ["web_search_20250305"]
    assert [t["function"]["name"] for t in sample.metadata["tools"]] == ["Read"]
    assert sample.metadata["dropped_media"] == {"image": 1}
    assert trajectory.ledger.to_dict()["dropped_media"] == {"image": 1}
    assert trajectory.ledger.to_dict()["turns"][0]["dropped_media"] == {"image": 1}
    assert 'tokentrail_dropped_media_total{kind="image"} 1.0' in metrics
