"""slime's adapter contract (`tests/test_agent/test_adapters.py` in THUDM/slime) against
`tokentrail.integrations.slime`.

As slime's tests do, every case drives a real adapter over aiohttp loopback and a real
`/generate` upstream (the stand-in SGLang, speaking SGLang's wire format); unlike them, the
tokenizer is a real Hugging Face one (`transformers.PreTrainedTokenizerFast` over Qwen3's
vocabulary), so the model's replies are token ids that decode to what the assertions read.
slime's cases that read its private helpers (`_translate_messages`, `_request_session_id`,
`parse_xml_tool_uses`) are checked through what those helpers decide: the messages the turn is
recorded with, the session a request lands in. Where tokentrail differs on purpose the test
asserts tokentrail's behaviour and says so (docs/integrations/slime.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from support.fake_engines import FakeSGLang
from support.slime import ScriptedReplies, hf_tokenizer
from tokentrail.errors import SamplingParamsError, SessionError, TokenizerError
from tokentrail.integrations.slime import (
    AnthropicAdapter,
    BaseAdapter,
    CompatSample,
    OpenAIAdapter,
    sample_class,
)
from tokentrail.text.hf import as_loaded

Sample = sample_class()


@pytest.fixture(scope="module")
def hf(tokenizer):
    return hf_tokenizer(tokenizer)


def _parse_sse(raw: str) -> list[tuple[str, object]]:
    events: list[tuple[str, object]] = []
    name, data_lines = "message", []
    for line in [*raw.splitlines(), ""]:
        if not line:
            if data_lines:
                data = "\n".join(data_lines)
                events.append((name, data if data == "[DONE]" else json.loads(data)))
            name, data_lines = "message", []
        elif line.startswith("event:"):
            name = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data_lines.append(line.removeprefix("data:").strip())
    return events


@asynccontextmanager
async def served(
    cls: type[BaseAdapter], hf: Any, replies: list, sid: str | None = None, **kwargs: Any
) -> AsyncIterator[tuple[BaseAdapter, TestClient, FakeSGLang, ScriptedReplies]]:
    script = ScriptedReplies(hf, replies)
    async with FakeSGLang(reply=script) as sglang:
        adapter = cls(tokenizer=hf, sglang_url=sglang.url, **kwargs)
        if sid is not None:
            adapter.open_session(sid)
        client = TestClient(TestServer(adapter.app))
        await client.start_server()
        try:
            yield adapter, client, sglang, script
        finally:
            await client.close()


async def _drain(adapter: BaseAdapter, sid: str) -> list:
    return await adapter.finish_session(sid, base_sample=Sample(index=0, prompt=""), reward=1.0)


def _bearer(sid: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {sid}"}


# -- §1 session id ------------------------------------------------------------------------------


def test_anthropic_session_id_from_bearer_or_api_key(hf) -> None:
    async def run() -> None:
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
        async with served(AnthropicAdapter, hf, ["a", "b"]) as (adapter, client, _, _):
            bearer = await client.post("/v1/messages", headers=_bearer("bsid"), json=body)
            key = await client.post("/v1/messages", headers={"X-Api-Key": "key"}, json=body)
            # Deliberate differences: two credentials naming different sessions are refused
            # (slime takes the bearer), and no credential is refused, not pooled into "default".
            both = await client.post(
                "/v1/messages", headers={**_bearer("bsid"), "X-Api-Key": "key"}, json=body
            )
            none = await client.post("/v1/messages", json=body)
            assert (bearer.status, key.status, both.status, none.status) == (200, 200, 400, 401)
            assert (await both.json())["error"]["type"] == "invalid_request_error"
            assert (await none.json())["error"]["type"] == "authentication_error"
            assert len(await _drain(adapter, "bsid")) == 1
            assert len(await _drain(adapter, "key")) == 1
            assert await _drain(adapter, "default") == []

    asyncio.run(run())


def test_openai_session_id_is_the_bearer(hf) -> None:
    async def run() -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "user": "u"}
        async with served(OpenAIAdapter, hf, ["a"]) as (adapter, client, _, _):
            resp = await client.post("/v1/chat/completions", headers=_bearer("bsid"), json=body)
            assert resp.status == 200
            assert len(await _drain(adapter, "bsid")) == 1
            # Deliberate difference: a body's `user` / `metadata.session_id` names no session
            # (any client could write into any session); AdapterConfig(session_from_body=True).
            assert await _drain(adapter, "u") == []

    asyncio.run(run())


# -- §2 translation (what the turn is recorded with) ----------------------------------------------


def test_anthropic_translation_keeps_tool_results_thinking_and_tools(hf) -> None:
    seen: list[tuple] = []
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "plan", "signature": ""},
                {"type": "text", "text": "ok"},
                {"type": "tool_use", "id": "u1", "name": "lookup", "input": {"q": "slime"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "u1", "content": "result"}],
        },
    ]
    tools = [{"name": "lookup", "description": "search", "input_schema": {"type": "object"}}]

    async def run() -> None:
        async with served(
            AnthropicAdapter, hf, ["fine"], "sid-t", debug_callback=lambda *a: seen.append(a)
        ) as (adapter, client, _, _):
            body = {
                "model": "m",
                "max_tokens": 8,
                "system": "sys",
                "messages": messages,
                "tools": tools,
            }
            resp = await client.post("/v1/messages", headers=_bearer("sid-t"), json=body)
            assert resp.status == 200, await resp.text()
            await _drain(adapter, "sid-t")

    asyncio.run(run())
    sid, translated, tools_schema, response, turn = seen[0]
    assert sid == "sid-t"
    assert [m["role"] for m in translated] == ["system", "user", "assistant", "tool"]
    assert translated[0]["content"] == "sys" and translated[1]["content"] == "hi"
    assistant = translated[2]
    assert assistant["content"] == "ok" and assistant["reasoning_content"] == "plan"
    call = assistant["tool_calls"][0]["function"]
    assert call == {"name": "lookup", "arguments": {"q": "slime"}}  # a dict, not JSON text
    assert translated[3]["content"] == "result"
    assert tools_schema == [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "search",
                "parameters": {"type": "object"},
            },
        }
    ]
    assert response == {"role": "assistant", "content": "fine"}
    assert list(turn.output_ids)[-1] == hf.convert_tokens_to_ids("<|im_end|>")


@pytest.mark.parametrize("results_by_position", [True, False])
def test_tool_calls_without_ids_take_results_in_order(hf, results_by_position: bool) -> None:
    """slime's own test sends a `tool_use` without an `id`; slime takes the results in the
    order they come. The drop-in pairs each call without an id with the next result that
    names no open call (by default), so results render in the order sent, as slime's; with
    `results_by_position=False` such a result is refused, as tokentrail's adapter does."""
    seen: list[tuple] = []
    calls = [{"type": "tool_use", "name": "lookup", "input": {"q": q}} for q in ("a", "b")]
    answers = [
        {"type": "tool_result", "tool_use_id": "u1", "content": "ra"},
        {"type": "tool_result", "tool_use_id": "u2", "content": "rb"},
    ]
    body = {
        "model": "m",
        "max_tokens": 8,
        "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": calls},
            {"role": "user", "content": answers},
        ],
    }

    async def run() -> None:
        async with served(
            AnthropicAdapter,
            hf,
            ["fine"],
            "sid-p",
            debug_callback=lambda *a: seen.append(a),
            results_by_position=results_by_position,
        ) as (ad, client, _, _):
            resp = await client.post("/v1/messages", headers=_bearer("sid-p"), json=body)
            answer = await resp.json()
            await _drain(ad, "sid-p")
        if results_by_position:
            assert resp.status == 200, answer
        else:
            assert resp.status == 400
            assert answer["error"]["type"] == "invalid_request_error"
            assert "'u1' has no matching tool call" in answer["error"]["message"]

    asyncio.run(run())
    if results_by_position:
        translated = seen[0][1]
        assert [(m["role"], m["content"]) for m in translated[2:]] == [
            ("tool", "ra"),
            ("tool", "rb"),
        ]
    else:
        assert seen == []


def test_openai_translation_developer_to_system_and_tool_calls_to_dict(hf) -> None:
    seen: list[tuple] = []
    messages = [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q": "slime"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "found"},
    ]

    async def run() -> None:
        async with served(
            OpenAIAdapter, hf, ["fine"], "sid-t", debug_callback=lambda *a: seen.append(a)
        ) as (adapter, client, _, _):
            body = {"model": "m", "messages": messages}
            resp = await client.post("/v1/chat/completions", headers=_bearer("sid-t"), json=body)
            assert resp.status == 200, await resp.text()
            await _drain(adapter, "sid-t")

    asyncio.run(run())
    translated = seen[0][1]
    assert [m["role"] for m in translated] == ["system", "user", "assistant", "tool"]
    assert translated[0]["content"] == "rules" and translated[1]["content"] == "hello"
    assert translated[2]["tool_calls"][0]["function"] == {
        "name": "lookup",
        "arguments": {"q": "slime"},
    }
    assert translated[3]["content"] == "found"


# -- §3 non-stream JSON and token capture ---------------------------------------------------------


def test_anthropic_messages_nonstream_records_token_segments(hf) -> None:
    async def run() -> None:
        async with served(AnthropicAdapter, hf, ["done now"], "sid-a") as (ad, client, sg, script):
            resp = await client.post(
                "/v1/messages",
                headers=_bearer("sid-a"),
                json={
                    "model": "m",
                    "max_tokens": 7,
                    "messages": [{"role": "user", "content": "hi"}],
                },
            )
            data = await resp.json()
            samples = await _drain(ad, "sid-a")
        assert resp.status == 200
        assert data["type"] == "message" and data["stop_reason"] == "end_turn"
        assert data["content"] == [{"type": "text", "text": "done now"}]
        request = sg.bodies("/generate")[0]
        assert request["sampling_params"]["max_new_tokens"] == 7
        assert (
            request["input_ids"]
            == hf.apply_chat_template(
                [{"role": "user", "content": "hi"}], tokenize=True, add_generation_prompt=True
            )["input_ids"]
        )
        assert sg.requests[0].headers["X-SMG-Routing-Key"] == "sid-a"
        assert len(samples) == 1
        s, out = samples[0], script.outputs[0]
        assert s.tokens == request["input_ids"] + out
        assert s.loss_mask == [1] * len(out) and s.response_length == len(out)
        # float32, as the engine reports them
        expected = [sg.answers[0]["output_token_logprobs"][i][0] for i in range(len(out))]
        assert s.rollout_log_probs == pytest.approx(expected, abs=1e-6)
        assert s.response == "done now<|im_end|>"
        assert s.status == Sample.Status.COMPLETED and s.reward == 1.0

    asyncio.run(run())


def test_openai_chat_completions_nonstream_records_token_segments(hf) -> None:
    async def run() -> None:
        async with served(OpenAIAdapter, hf, ["hello"], "sid-o") as (ad, client, sg, script):
            resp = await client.post(
                "/v1/chat/completions",
                headers=_bearer("sid-o"),
                json={
                    "model": "m",
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": "hi?"}],
                },
            )
            data = await resp.json()
            samples = await _drain(ad, "sid-o")
        assert resp.status == 200
        assert data["object"] == "chat.completion"
        message = data["choices"][0]["message"]
        assert message["role"] == "assistant" and message["content"] == "hello"
        assert data["choices"][0]["finish_reason"] == "stop"
        assert sg.bodies("/generate")[0]["sampling_params"]["max_new_tokens"] == 4
        assert len(samples) == 1
        assert samples[0].tokens[-len(script.outputs[0]) :] == script.outputs[0]
        assert samples[0].loss_mask[-1] == 1

    asyncio.run(run())


def test_openai_adapter_serves_the_responses_api(hf) -> None:
    async def run() -> None:
        async with served(OpenAIAdapter, hf, ["hello"], "sid-r") as (ad, client, _, script):
            resp = await client.post(
                "/v1/responses",
                headers=_bearer("sid-r"),
                json={"model": "m", "input": [{"role": "user", "content": "hi?"}]},
            )
            data = await resp.json()
            samples = await _drain(ad, "sid-r")
        assert resp.status == 200, data
        assert data["object"] == "response" and data["status"] == "completed"
        texts = [c["text"] for o in data["output"] for c in o.get("content", [])]
        assert texts == ["hello"]
        assert len(samples) == 1 and sum(samples[0].loss_mask) == len(script.outputs[0])

    asyncio.run(run())


# -- §4 streaming -------------------------------------------------------------------------------


def test_anthropic_messages_streams_blocks(hf) -> None:
    async def run() -> None:
        async with served(AnthropicAdapter, hf, ["streamed"], "sid-as") as (ad, client, _, _):
            resp = await client.post(
                "/v1/messages",
                headers={**_bearer("sid-as"), "Accept": "text/event-stream"},
                json={
                    "model": "m",
                    "stream": True,
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "x"}],
                },
            )
            raw = await resp.text()
            await _drain(ad, "sid-as")
        events = _parse_sse(raw)
        names = [name for name, _ in events]
        assert names[0] == "message_start" and names[-1] == "message_stop"
        deltas = [p for n, p in events if n == "content_block_delta"]
        assert "".join(d["delta"].get("text", "") for d in deltas) == "streamed"

    asyncio.run(run())


@pytest.mark.parametrize("bare_role_chunk", [True, False])
def test_openai_chat_completions_streams_chunks_until_done(hf, bare_role_chunk: bool) -> None:
    """The first chunk's delta is slime's `{"role": "assistant"}` by default; with
    `bare_role_chunk=False` it is OpenAI's, `content: ""` beside the role."""

    async def run() -> None:
        async with served(
            OpenAIAdapter, hf, ["streamed text"], "sid-os", bare_role_chunk=bare_role_chunk
        ) as (ad, client, _, _):
            resp = await client.post(
                "/v1/chat/completions",
                headers=_bearer("sid-os"),
                json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]},
            )
            raw = await resp.text()
            await _drain(ad, "sid-os")
        events = _parse_sse(raw)
        chunks = [p for _, p in events if isinstance(p, dict)]
        role = {"role": "assistant"} if bare_role_chunk else {"role": "assistant", "content": ""}
        assert chunks[0]["choices"][0]["delta"] == role
        text = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        assert text == "streamed text"
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert finishes[-1] == "stop"
        assert events[-1] == ("message", "[DONE]")

    asyncio.run(run())


def test_the_openai_sdk_reads_the_bare_role_chunk(hf) -> None:
    """OpenAI's SDK assembles a stream that opens with slime's bare role chunk as it does
    OpenAI's own: the role, the whole text, the finish."""

    async def run() -> Any:
        async with served(OpenAIAdapter, hf, ["streamed text"], "sid-sdk") as (ad, client, _, _):
            sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="sid-sdk")
            async with sdk.chat.completions.stream(
                model="m", messages=[{"role": "user", "content": "x"}]
            ) as stream:
                completion = await stream.get_final_completion()
            await _drain(ad, "sid-sdk")
        return completion

    completion = asyncio.run(run())
    choice = completion.choices[0]
    assert (choice.message.role, choice.message.content) == ("assistant", "streamed text")
    assert choice.finish_reason == "stop"


# -- §5 multi-turn token alignment ----------------------------------------------------------------


def test_anthropic_multiturn_wire_roundtrip_and_token_capture(hf) -> None:
    call = [{"type": "tool_use", "name": "lookup", "input": {"query": "slime"}}]
    tools = [
        {
            "name": "lookup",
            "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
        }
    ]
    first_messages = [{"role": "user", "content": [{"type": "text", "text": "find slime"}]}]

    seen: list[tuple] = []

    async def run() -> None:
        async with served(
            AnthropicAdapter,
            hf,
            [call, "the answer"],
            "sid-mt",
            debug_callback=lambda *a: seen.append(a),
        ) as (ad, client, sg, script):
            body = {"model": "m", "max_tokens": 64, "tools": tools, "messages": first_messages}
            first = await client.post("/v1/messages", headers=_bearer("sid-mt"), json=body)
            fdata = await first.json()
            tool_use = next(b for b in fdata["content"] if b["type"] == "tool_use")
            body["messages"] = [
                *first_messages,
                {"role": "assistant", "content": fdata["content"]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": tool_use["id"], "content": "found"}
                    ],
                },
            ]
            second = await client.post("/v1/messages", headers=_bearer("sid-mt"), json=body)
            sdata = await second.json()
            samples = await _drain(ad, "sid-mt")
        assert first.status == 200 and second.status == 200
        assert fdata["stop_reason"] == "tool_use"
        assert tool_use["name"] == "lookup" and tool_use["input"] == {"query": "slime"}
        assert sdata["content"] == [{"type": "text", "text": "the answer"}]
        assert [r.headers["X-SMG-Routing-Key"] for r in sg.requests] == ["sid-mt", "sid-mt"]
        p0, p1 = script.prompts
        # The second prompt holds the first prompt and the sampled ids, token for token, and
        # is, spliced, what the object's own apply_chat_template makes of the conversation.
        assert p1[: len(p0) + len(script.outputs[0])] == p0 + script.outputs[0]
        for (_, translated, tools_schema, _, _), ids in zip(seen, script.prompts, strict=True):
            full = hf.apply_chat_template(
                translated, tools=tools_schema, tokenize=True, add_generation_prompt=True
            )
            assert ids == full["input_ids"]
        # One sample, every generated token trained (slime: "at least one partly-trained").
        assert len(samples) == 1
        s = samples[0]
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
        assert sum(s.loss_mask) == len(script.outputs[0]) + len(script.outputs[1])
        assert s.metadata["use_tool"] is True
        assert [e["trained"] for e in s.metadata["ledger"]] == [len(o) for o in script.outputs]
        assert [e["history"] for e in s.metadata["ledger"]] == ["render", "splice"]

    asyncio.run(run())


# -- §6 turn cap, lifecycle ---------------------------------------------------------------------


def test_max_turns_per_sid_returns_429(hf) -> None:
    async def run() -> None:
        async with served(AnthropicAdapter, hf, ["a", "b"], "sid-cap", max_turns_per_sid=1) as (
            ad,
            client,
            sg,
            _,
        ):
            body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
            first = await client.post("/v1/messages", headers=_bearer("sid-cap"), json=body)
            second = await client.post("/v1/messages", headers=_bearer("sid-cap"), json=body)
            error = await second.json()
            await _drain(ad, "sid-cap")
        assert first.status == 200 and second.status == 429
        assert error["type"] == "error" and error["error"]["type"] == "rate_limit_error"
        assert len(sg.bodies("/generate")) == 1

    asyncio.run(run())


@pytest.mark.parametrize("system_reminder", [True, False])
def test_mid_list_system_folds_into_user(hf, system_reminder: bool) -> None:
    """slime folds a mid-list system message into the user turn before it, wrapped in its own
    `<system-reminder>`, and renders that block as a user message of its own: so does the
    drop-in by default; `system_reminder=False` joins it to that user turn as text, as
    tokentrail's adapter does."""
    seen: list[tuple] = []

    async def run() -> None:
        async with served(
            AnthropicAdapter,
            hf,
            ["ok"],
            "sid-s",
            debug_callback=lambda *a: seen.append(a),
            system_reminder=system_reminder,
        ) as (ad, client, _, _):
            body = {
                "model": "m",
                "max_tokens": 8,
                "messages": [
                    {"role": "user", "content": "hello"},
                    {"role": "system", "content": "skills list"},
                    {"role": "user", "content": "next"},
                ],
            }
            resp = await client.post("/v1/messages", headers=_bearer("sid-s"), json=body)
            assert resp.status == 200, await resp.text()
            assert len(await _drain(ad, "sid-s")) == 1

    asyncio.run(run())
    translated = seen[0][1]
    if system_reminder:  # slime's translation of its folded body, message for message
        assert translated == [
            {"role": "user", "content": "hello"},
            {"role": "user", "content": "<system-reminder>\nskills list\n</system-reminder>\n"},
            {"role": "user", "content": "next"},
        ]
    else:
        assert translated == [
            {"role": "user", "content": "hello\n\nskills list"},
            {"role": "user", "content": "next"},
        ]


def test_model_output_parsing() -> None:
    """slime's parsing cases, with Qwen3's parsers (what the adapters pick for Qwen3)."""
    from tokentrail.text.parsing import parse_output

    assert parse_output("just text", None, None).message == {
        "role": "assistant",
        "content": "just text",
    }
    think = parse_output("<think>reason here</think>visible", None, "qwen3").message
    assert (think["content"], think["reasoning_content"]) == ("visible", "reason here")
    lookup = [
        {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    ]
    call = "<tool_call><function=lookup><parameter=q>slime</parameter></function></tool_call>"
    parsed = parse_output(f"lead {call}", "qwen3_coder", None, tools=lookup)
    assert parsed.message["content"] == "lead "  # kept as sampled
    assert parsed.message["tool_calls"][0]["function"] == {
        "name": "lookup",
        "arguments": {"q": "slime"},
    }
    # Deliberate differences (docs/integrations/slime.md): text after the calls makes the
    # turn ill-formed text; a call to a tool the request did not list is still a call.
    after = parse_output(f"lead {call} tail", "qwen3_coder", None, tools=lookup)
    assert after.ill_formed and "tool_calls" not in after.message
    unknown = call.replace("lookup", "unknown")
    calls = parse_output(unknown, "qwen3_coder", None, tools=lookup).message["tool_calls"]
    assert calls[0]["function"]["name"] == "unknown"


def test_open_session_twice_raises_and_finish_is_idempotent(hf) -> None:
    async def run() -> None:
        async with served(AnthropicAdapter, hf, ["a"], "sid-1") as (ad, client, _, _):
            with pytest.raises(SessionError, match="already exists"):
                ad.open_session("sid-1")
            assert isinstance(SessionError("x"), ValueError)  # slime raises ValueError
            body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
            assert (
                await client.post("/v1/messages", headers=_bearer("sid-1"), json=body)
            ).status == 200
            assert len(await _drain(ad, "sid-1")) == 1
            assert await _drain(ad, "sid-1") == []
            assert await _drain(ad, "never-opened") == []
            # A finished session takes no more turns.
            late = await client.post("/v1/messages", headers=_bearer("sid-1"), json=body)
            assert late.status == 410  # slime: 503 "session closed"

    asyncio.run(run())


def test_drop_session_forgets_the_turns(hf) -> None:
    async def run() -> None:
        async with served(OpenAIAdapter, hf, ["a"], "sid-d") as (ad, client, _, _):
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
            resp = await client.post("/v1/chat/completions", headers=_bearer("sid-d"), json=body)
            assert resp.status == 200
            assert ad.manager.turn_count("sid-d") == 1
            await ad.drop_session("sid-d")
            assert not ad.manager.has_session("sid-d")
            assert await _drain(ad, "sid-d") == []

    asyncio.run(run())


def test_slime_sampling_params_are_accepted_and_unknown_ones_refused(hf) -> None:
    """slime passes its SGLang `sampling_params` as `sampling_defaults`: the sampling keys
    reach the engine, the output-format keys are the engine client's own."""

    async def run() -> None:
        async with served(AnthropicAdapter, hf, ["a"]) as (ad, client, sg, _):
            ad.open_session(
                "sid-p",
                sampling_defaults={
                    "temperature": 0.6,
                    "top_p": 0.9,
                    "top_k": 20,
                    "max_new_tokens": 16,
                    "stop": None,
                    "stop_token_ids": None,
                    "skip_special_tokens": False,
                    "no_stop_trim": True,
                    "spaces_between_special_tokens": False,
                },
            )
            with pytest.raises(SamplingParamsError, match="repetition_penalty"):
                ad.open_session("sid-q", sampling_defaults={"repetition_penalty": 1.1})
            with pytest.raises(SamplingParamsError, match="stop_token_ids"):
                ad.open_session("sid-q", sampling_defaults={"stop_token_ids": [13]})
            im_end = hf.convert_tokens_to_ids("<|im_end|>")
            ad.open_session("sid-q", sampling_defaults={"stop_token_ids": [im_end]})
            body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}]}
            assert (
                await client.post("/v1/messages", headers=_bearer("sid-p"), json=body)
            ).status == 200
            await _drain(ad, "sid-p")
        sp = sg.bodies("/generate")[0]["sampling_params"]
        assert (sp["temperature"], sp["top_p"], sp["top_k"], sp["max_new_tokens"]) == (
            0.6,
            0.9,
            20,
            16,
        )

    asyncio.run(run())


def test_a_session_losing_training_signal_is_warned(hf, caplog) -> None:
    """What slime cannot say: a finished session whose tool-call turns lost training signal
    logs a WARNING naming it, and every sample carries its turns' ledger entries."""
    call = [{"type": "tool_use", "name": "lookup", "input": {"query": "slime"}}]
    tools = [{"name": "lookup", "input_schema": {"type": "object"}}]

    async def run() -> None:
        # restore off: the harness's re-rendered echo drifts, and the drift masks the call.
        async with served(AnthropicAdapter, hf, [call, "done"], "sid-w", restore="off") as (
            ad,
            client,
            _,
            _,
        ):
            first_messages = [{"role": "user", "content": "find"}]
            body = {"model": "m", "max_tokens": 64, "tools": tools, "messages": first_messages}
            first = await (
                await client.post("/v1/messages", headers=_bearer("sid-w"), json=body)
            ).json()
            use = first["content"][0]
            # The harness replays the call with its arguments re-serialized (key spacing).
            echoed = {**use, "input": {"query": "slime "}}
            body["messages"] = [
                *first_messages,
                {"role": "assistant", "content": [echoed]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "x"}],
                },
            ]
            assert (
                await client.post("/v1/messages", headers=_bearer("sid-w"), json=body)
            ).status == 200
            with caplog.at_level(logging.WARNING):
                samples = await _drain(ad, "sid-w")
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("sid-w" in w and "lost training signal" in w for w in warnings), warnings
        # The merged-away call trains nowhere; the sample holds the answer's ledger entry.
        assert [[e["turn_index"] for e in s.metadata["ledger"]] for s in samples] == [[2]]

    asyncio.run(run())


# -- tokenizers ---------------------------------------------------------------------------------


def test_a_hugging_face_tokenizer_gives_the_builtin_prompts(hf, tokenizer) -> None:
    loaded = as_loaded(hf)
    assert as_loaded(hf) is loaded  # wrapped once per object
    assert loaded.family == "qwen3" and loaded.eos_token == "<|im_end|>"
    assert loaded.end_token_ids == tokenizer.end_token_ids
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "héllo wörld 123"}]
    assert (
        loaded.encode(loaded.render_chat(messages))
        == hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)["input_ids"]
    )


def _tiny(cls: Any, template: str | None) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(["<eos>"])
    tok = cls(tokenizer_object=backend, eos_token="<eos>")
    tok.chat_template = template
    return tok


def test_a_tokenizer_tokentrail_cannot_reproduce_is_refused() -> None:
    import transformers

    class Prefixing(transformers.PreTrainedTokenizerFast):
        """Its apply_chat_template adds to what its template renders (as some processors do)."""

        def apply_chat_template(self, conversation: Any, *args: Any, **kwargs: Any) -> Any:
            out = super().apply_chat_template(conversation, *args, **kwargs)
            return "<eos>" + out if isinstance(out, str) else out

    template = "{% for m in messages %}{{ m['content'] | upper }} <eos> {% endfor %}"
    plain = as_loaded(_tiny(transformers.PreTrainedTokenizerFast, template))
    assert plain.encode(plain.render_chat([{"role": "user", "content": "a b"}])) == [2, 2, 3]
    with pytest.raises(TokenizerError, match="renders its chat template differently"):
        as_loaded(_tiny(Prefixing, template))
    with pytest.raises(TokenizerError, match="no chat template"):
        as_loaded(_tiny(transformers.PreTrainedTokenizerFast, None))

    class Slow:
        chat_template = "x"

    with pytest.raises(TokenizerError, match="not a fast tokenizer"):
        as_loaded(Slow())  # type: ignore[arg-type]


def test_samples_are_slimes_shape_without_slime() -> None:
    assert sample_class() is CompatSample  # slime is not installed here
    s = CompatSample(index=3, prompt="p")
    assert s.status is CompatSample.Status.PENDING and s.rollout_id is None and s.tokens == []


def test_routed_experts_fill_slimes_field_at_a_real_moe_shape(hf) -> None:
    """48 layers x top-8 of 128 experts (Qwen3-30B-A3B's shape): every fed-forward position's
    row, taken from the request that computed it, in slime's (len(tokens) - 1, layers, top-k)."""
    import numpy as np

    from tokentrail.core.routing import RoutingShape
    from tokentrail.sim.moe import KVRouting

    shape = RoutingShape(48, 8, 128)
    kv = KVRouting(shape)

    async def run() -> list:
        script = ScriptedReplies(hf, ["looking", "done"])
        async with FakeSGLang(reply=script, routing=kv) as sglang:
            adapter = AnthropicAdapter(tokenizer=hf, sglang_url=sglang.url, routing=shape)
            adapter.open_session("sid-moe")
            client = TestClient(TestServer(adapter.app))
            await client.start_server()
            try:
                messages: list[dict] = [{"role": "user", "content": "fix it"}]
                for _ in range(2):
                    body = {"model": "m", "max_tokens": 32, "messages": messages}
                    resp = await client.post("/v1/messages", headers=_bearer("sid-moe"), json=body)
                    assert resp.status == 200, await resp.text()
                    answer = await resp.json()
                    messages += [
                        {"role": "assistant", "content": answer["content"]},
                        {"role": "user", "content": "go on"},
                    ]
            finally:
                await client.close()
            assert sglang.bodies("/generate")[1]["routed_experts_start_len"] > 0
            return await _drain(adapter, "sid-moe")

    (s,) = asyncio.run(run())
    rows = s.rollout_routed_experts
    # A typed array as slime's own rollout gives it (int32), not nested lists.
    assert isinstance(rows, np.ndarray) and rows.dtype == np.int32
    assert rows.shape == (len(s.tokens) - 1, 48, 8)
    held, computed_by = kv.rows_of(s.tokens)
    assert rows.tolist() == held[: len(s.tokens) - 1].tolist()
    assert len(set(computed_by[: len(s.tokens) - 1].tolist())) == 2  # both turns' rows
    assert s.metadata["replay"]["routed_experts"]["missing"] == {}


_WORDS = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=24
)


@st.composite
def _conversations(draw: st.DrawFn) -> tuple[list[dict], list[dict] | None]:
    messages: list[dict] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_WORDS)})
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(_WORDS)})
        reply: dict = {"role": "assistant", "content": draw(_WORDS)}
        if draw(st.booleans()):
            reply["reasoning_content"] = draw(_WORDS)
        if draw(st.booleans()):
            args = draw(st.dictionaries(st.sampled_from(["q", "path", "n"]), _WORDS, max_size=2))
            reply["tool_calls"] = [
                {"type": "function", "function": {"name": "lookup", "arguments": args}}
            ]
            messages += [reply, {"role": "tool", "content": draw(_WORDS)}]
        else:
            messages.append(reply)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": draw(_WORDS),
                "parameters": {"type": "object"},
            },
        }
    ]
    return messages, tools if draw(st.booleans()) else None


@settings(max_examples=60, deadline=None)
@given(conversation=_conversations())
def test_prompts_equal_the_hugging_face_objects_own(hf, conversation) -> None:
    """The fast path (tokentrail's template rendering, the Rust core's encoder) against the slow
    one (the object's own `apply_chat_template(tokenize=True)`), on generated conversations."""
    from tokentrail.text.incremental import IncrementalEncoder

    messages, tools = conversation
    loaded = as_loaded(hf)
    theirs = hf.apply_chat_template(
        messages, tools=tools, tokenize=True, add_generation_prompt=True
    )
    text = loaded.render_chat(messages, tools)
    assert text == hf.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert IncrementalEncoder(loaded).encode_full(text).tolist() == theirs["input_ids"]


def test_tokentrails_own_adapter_takes_the_hugging_face_object(hf) -> None:
    from tokentrail.adapter import Adapter
    from tokentrail.engines.scripted import ScriptedEngine

    async def run() -> list:
        adapter = Adapter(engine=ScriptedEngine(hf), tokenizer=hf)
        assert adapter.tokenizer is as_loaded(hf)
        client = TestClient(TestServer(adapter.app))
        await client.start_server()
        try:
            body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}]}
            resp = await client.post("/v1/messages", headers=_bearer("own"), json=body)
            assert resp.status == 200, await resp.text()
        finally:
            await client.close()
        return await adapter.finish_session("own", reward=1.0)

    (sample,) = asyncio.run(run())
    assert sample.trained_tokens == sample.response_length > 0


def test_slimes_own_sample_is_used_when_slime_is_importable() -> None:
    """With slime importable, `Sample`s are slime's class (here a stand-in module of that name,
    the shape of `slime.utils.types.Sample`: slime is not on PyPI)."""
    import dataclasses
    import sys
    import types

    import numpy as np

    from tokentrail.integrations.slime.sample import to_slime
    from tokentrail.trajectory.sample import Sample as TrailSample

    @dataclasses.dataclass
    class SlimeSample(CompatSample):
        pass

    module = types.ModuleType("slime.utils.types")
    module.Sample = SlimeSample  # type: ignore[attr-defined]
    mp = pytest.MonkeyPatch()
    for name in ("slime", "slime.utils"):
        mp.setitem(sys.modules, name, types.ModuleType(name))
    mp.setitem(sys.modules, "slime.utils.types", module)
    sample_class.cache_clear()
    try:
        assert sample_class() is SlimeSample
        trail = TrailSample(
            tokens=np.array([1, 2, 3], dtype=np.uint32),
            loss_mask=np.array([1], dtype=np.int32),
            rollout_log_probs=np.array([-0.5], dtype=np.float32),
            response_length=1,
            reward=0.5,
        )
        out = to_slime(trail, SlimeSample(index=4, group_index=1, prompt="p"))
        assert type(out) is SlimeSample and out.rollout_id == 4 and out.tokens == [1, 2, 3]
        assert (out.loss_mask, out.rollout_log_probs, out.reward) == ([1], [-0.5], 0.5)
    finally:
        mp.undo()
        sample_class.cache_clear()
    assert sample_class() is CompatSample
