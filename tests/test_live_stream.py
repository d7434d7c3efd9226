"""Streaming to the harness as tokens are sampled (`serve --engine-stream`): the adapter in
process over real sockets, SGLang and vLLM stand-ins that stream as the engines do, the
official anthropic and openai SDKs as clients, and the real Qwen3 vocabulary.

A reply's thinking and text reach the client while the engine is still sampling; the streamed
message equals the non-streamed one (thinking, text, tool call); the turn recorded from a
streamed engine answer equals the one recorded from a whole answer, token for token and bit
for bit; a keepalive goes out while the engine has produced nothing; an engine failing after
the 200 is an in-stream error in the protocol's shape; a client gone mid-stream aborts the
engine request.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from support.fake_engines import IM_END, FakeSGLang, FakeVLLM
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.engines.sglang import SGLangEngine
from tokentrail.engines.vllm import VLLMEngine
from tokentrail.storage.journal import Journal
from tokentrail.text.parsing import format_output

ADMIN = "live-admin"
BASH = {
    "name": "Bash",
    "description": "Run a shell command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
MESSAGE = {
    "role": "assistant",
    "reasoning_content": "The user wants the tests run. I will call Bash with pytest first, "
    "then read what fails. Let me think about which flags: -q -x keeps it short.",
    "content": "I'll run the test suite now — 日本語 too, and an emoji 😀.",
    "tool_calls": [
        {"type": "function", "function": {"name": "Bash", "arguments": {"command": "pytest -q"}}}
    ],
}
ANTHROPIC_BODY: dict[str, Any] = {
    "model": "m",
    "max_tokens": 512,
    "system": "You are a coding agent.",
    "messages": [{"role": "user", "content": "Run the tests."}],
    "tools": [BASH],
}
WIRES = {"sglang": (FakeSGLang, SGLangEngine), "vllm": (FakeVLLM, VLLMEngine)}


def sampled(tokenizer) -> tuple[list[int], list[float]]:
    ids = tokenizer.encode(format_output(MESSAGE, "hermes", "qwen3")) + [IM_END]
    return ids, [-0.001 * (i % 97) - 1e-9 * i for i in range(len(ids))]


def reply_for(tokenizer):
    ids, logprobs = sampled(tokenizer)
    return lambda _prompt: (list(ids), list(logprobs), "stop")


def serve(
    fake: Any,
    client_cls: type,
    tokenizer,
    scenario,
    *,
    stream: bool = True,
    journal: Journal | None = None,
    keep: list[Adapter] | None = None,
    **config,
):
    async def go():
        async with fake as srv:
            engine = client_cls(srv.url, stream=stream)
            adapter = Adapter(
                engine=engine,
                tokenizer=tokenizer,
                config=AdapterConfig(admin_token=ADMIN, live_stream=stream, **config),
                journal=journal,
            )
            if keep is not None:
                keep.append(adapter)
            runner, url = await start_server(adapter)
            try:
                return await scenario(url, srv)
            finally:
                await runner.cleanup()
                await engine.close()

    return asyncio.run(go())


async def finished(url: str, sid: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}/tokentrail/sessions/{sid}/finish",
            json={},
            headers={"Authorization": f"Bearer {ADMIN}"},
        ) as resp:
            return await resp.json()


@pytest.mark.parametrize("wire", list(WIRES))
def test_anthropic_stream_goes_out_as_sampled_and_equals_the_whole_reply(tokenizer, wire) -> None:
    fake_cls, client_cls = WIRES[wire]
    fake = fake_cls(reply_for(tokenizer), token_delay_s=0.01)

    async def scenario(url: str, srv: Any):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="s-live", max_retries=0)
        kinds: list[str] = []
        early = None
        async with client.messages.stream(**ANTHROPIC_BODY) as stream:
            async for event in stream:
                kinds.append(event.type)
                if event.type == "content_block_delta" and early is None:
                    (events,) = srv.streamed.values()
                    # How many of its events the engine had sent when the first delta arrived.
                    early = len(events)
            final = await stream.get_final_message()
        whole = await client.messages.create(**ANTHROPIC_BODY)  # a retry: the recorded reply
        (events,) = srv.streamed.values()
        return kinds, early, len(events), final, whole

    kinds, early, total, final, whole = serve(fake, client_cls, tokenizer, scenario)
    assert early is not None and early < total / 2  # the harness heard it mid-generation
    blocks = [b.model_dump() for b in final.content]
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    assert blocks[0]["thinking"] == MESSAGE["reasoning_content"]
    assert blocks[1]["text"] == MESSAGE["content"]
    assert blocks[2]["input"] == {"command": "pytest -q"}
    assert final.stop_reason == "tool_use"
    assert [b.model_dump() for b in whole.content] == blocks
    assert final.id == whole.id and final.usage.output_tokens == whole.usage.output_tokens
    assert kinds.count("content_block_delta") > 10


def recorded(tokenizer, wire: str, stream: bool) -> dict[str, Any]:
    fake_cls, client_cls = WIRES[wire]

    async def scenario(url: str, srv: Any):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="s-rec", max_retries=0)
        if stream:
            async with client.messages.stream(**ANTHROPIC_BODY) as s:
                await s.get_final_message()
        else:
            await client.messages.create(**ANTHROPIC_BODY)
        return await finished(url, "s-rec")

    return serve(
        fake_cls(reply_for(tokenizer), tokens_per_event=3),
        client_cls,
        tokenizer,
        scenario,
        stream=stream,
    )


# What the harness has seen of the call's arguments when the engine pauses (`mid_arguments`).
MID_ARGUMENTS = '{"command": "py'


def mid_arguments(tokenizer) -> int:
    """How many of the sampled tokens end inside the Bash call's `command` string."""
    ids, _ = sampled(tokenizer)
    return next(k for k in range(len(ids)) if '"command": "py' in tokenizer.decode(ids[:k]))


def call_ids_recorded(adapter: Adapter, sid: str, reply_id: str) -> list[str]:
    """The call ids the session's turn that wrote `reply_id` was recorded with (TurnTags)."""
    found = adapter.manager.find_turn(sid, "reply_id", reply_id)
    assert found is not None
    return list(found[1]["call_ids"])


@pytest.mark.parametrize("wire", list(WIRES))
def test_anthropic_tool_input_streams_while_the_engine_samples_it(tokenizer, wire) -> None:
    """The engine pauses inside the call's arguments: the SDK has already seen the tool_use
    block and a partial_json of its input; the final message, its call id and the recorded
    turn's call id are the non-streamed reply's."""
    fake_cls, client_cls = WIRES[wire]
    fake = fake_cls(reply_for(tokenizer), hold_at=mid_arguments(tokenizer))
    keep: list[Adapter] = []

    async def scenario(url: str, srv: Any):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="s-args", max_retries=0)
        held: list[str] = []
        started: list[str] = []
        seen = ""
        async with client.messages.stream(**ANTHROPIC_BODY) as stream:
            async for event in stream:
                if event.type == "content_block_start" and event.content_block.type == "tool_use":
                    started.append(event.content_block.id)
                if event.type == "input_json":
                    seen += event.partial_json
                    # The tokens before the pause may come in more than one delta (a run each).
                    if srv.holding and seen.startswith(MID_ARGUMENTS) and not held:
                        held.append(seen)
                        srv.release.set()
            final = await stream.get_final_message()
        whole = await client.messages.create(**ANTHROPIC_BODY)  # a retry: the recorded reply
        return held, started, final, whole

    held, started, final, whole = serve(fake, client_cls, tokenizer, scenario, keep=keep)
    assert held and held[0].startswith(MID_ARGUMENTS)  # seen mid-arguments
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    tool_use = final.content[-1]
    assert tool_use.type == "tool_use" and tool_use.input == {"command": "pytest -q"}
    assert started == [tool_use.id] == call_ids_recorded(keep[0], "s-args", final.id)


CHAT_BODY: dict[str, Any] = {
    "model": "m",
    "max_tokens": 512,
    "messages": [{"role": "user", "content": "Run the tests."}],
    "tools": [
        {
            "type": "function",
            "function": {"name": "Bash", "description": "Run.", "parameters": BASH["input_schema"]},
        }
    ],
}


@pytest.mark.parametrize("wire", list(WIRES))
def test_chat_tool_arguments_stream_while_the_engine_samples_them(tokenizer, wire) -> None:
    fake_cls, client_cls = WIRES[wire]
    fake = fake_cls(reply_for(tokenizer), hold_at=mid_arguments(tokenizer))
    keep: list[Adapter] = []

    async def scenario(url: str, srv: Any):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="s-chat-args", max_retries=0)
        held, ids, arguments = [], [], ""
        stream = await client.chat.completions.create(**CHAT_BODY, stream=True)
        reply_id = None
        async for chunk in stream:
            reply_id = chunk.id
            for call in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
                if call.id:
                    ids.append(call.id)
                arguments += call.function.arguments or ""
                if srv.holding and arguments.startswith(MID_ARGUMENTS) and not held:
                    held.append(arguments)
                    srv.release.set()
        whole = await client.chat.completions.create(**CHAT_BODY)  # the recorded reply
        return held, ids, arguments, reply_id, whole

    held, ids, arguments, reply_id, whole = serve(fake, client_cls, tokenizer, scenario, keep=keep)
    assert held and held[0].startswith(MID_ARGUMENTS)
    (call,) = whole.choices[0].message.tool_calls
    assert arguments == call.function.arguments  # byte for byte
    assert ids == [call.id] == call_ids_recorded(keep[0], "s-chat-args", reply_id)


RESPONSES_BODY: dict[str, Any] = {
    "model": "m",
    "max_output_tokens": 512,
    "input": "Run the tests.",
    "tools": [{"type": "function", "name": "Bash", "parameters": BASH["input_schema"]}],
}


@pytest.mark.parametrize("wire", list(WIRES))
def test_responses_events_go_out_as_sampled(tokenizer, wire) -> None:
    """The OpenAI SDK's Responses stream: created at once, the reasoning, text and call items
    as sampled (the call's arguments seen while the engine pauses inside them), each item's id
    and index the completed response's, and that response the non-streamed reply."""
    fake_cls, client_cls = WIRES[wire]
    fake = fake_cls(reply_for(tokenizer), hold_at=mid_arguments(tokenizer))
    keep: list[Adapter] = []

    async def scenario(url: str, srv: Any):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="s-resp", max_retries=0)
        events: list[Any] = []
        held: list[str] = []
        seen = ""
        stream = await client.responses.create(**RESPONSES_BODY, stream=True)
        async for event in stream:
            events.append(event)
            if event.type == "response.function_call_arguments.delta":
                seen += event.delta
                if srv.holding and seen.startswith(MID_ARGUMENTS) and not held:
                    held.append(seen)
                    srv.release.set()
        final = events[-1].response
        whole = await client.responses.create(**RESPONSES_BODY)  # the recorded reply
        return events, held, final, whole

    events, held, final, whole = serve(fake, client_cls, tokenizer, scenario, keep=keep)
    assert held and held[0].startswith(MID_ARGUMENTS)
    assert final.model_dump() == whole.model_dump()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # Events that arrive together are handed on together (the stand-in writes all it has at
    # once): each item streams, and the call's arguments before and after the pause apart.
    for kind in ("reasoning_text", "output_text"):
        assert kinds.count(f"response.{kind}.delta") >= 1, kind
    assert kinds.count("response.function_call_arguments.delta") > 1
    added = [(e.output_index, e.item.id) for e in events if e.type == "response.output_item.added"]
    assert added == [(i, item.id) for i, item in enumerate(final.output)]
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    call = final.output[-1]
    arguments = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    assert arguments == call.arguments == '{"command": "pytest -q"}'
    assert [call.call_id] == call_ids_recorded(keep[0], "s-resp", final.id)


@pytest.mark.parametrize("wire", list(WIRES))
def test_the_recorded_turn_is_the_same_streamed_or_whole(tokenizer, wire) -> None:
    streamed, whole = recorded(tokenizer, wire, True), recorded(tokenizer, wire, False)
    ids, logprobs = sampled(tokenizer)
    (sample,) = streamed["samples"]
    assert json.dumps(streamed["samples"], sort_keys=True) == json.dumps(
        whole["samples"], sort_keys=True
    )
    assert json.dumps(streamed["ledger"], sort_keys=True) == json.dumps(
        whole["ledger"], sort_keys=True
    )
    text = json.dumps(sample)
    assert str(ids[5]) in text


def test_chat_completions_stream_as_sampled(tokenizer) -> None:
    fake = FakeSGLang(reply_for(tokenizer), token_delay_s=0.01)
    body = {
        "model": "m",
        "max_tokens": 512,
        "messages": [{"role": "user", "content": "Run the tests."}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "Bash",
                    "description": "Run.",
                    "parameters": BASH["input_schema"],
                },
            }
        ],
        "stream_options": {"include_usage": True},
    }

    async def scenario(url: str, srv: Any):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="s-chat", max_retries=0)
        reasoning, content, calls, early, usage = "", "", {}, None, None
        stream = await client.chat.completions.create(**body, stream=True)
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            extra = delta.model_extra or {}
            if extra.get("reasoning_content"):
                reasoning += extra["reasoning_content"]
                if early is None:
                    early = len(next(iter(srv.streamed.values())))
            content += delta.content or ""
            for call in delta.tool_calls or ():
                entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
        total = len(next(iter(srv.streamed.values())))
        return reasoning, content, calls, early, total, usage

    reasoning, content, calls, early, total, usage = serve(fake, SGLangEngine, tokenizer, scenario)
    assert reasoning == MESSAGE["reasoning_content"]
    assert content == MESSAGE["content"]
    assert calls == {0: {"name": "Bash", "arguments": '{"command": "pytest -q"}'}}
    assert early is not None and early < total / 2
    assert usage is not None and usage.completion_tokens == len(sampled(tokenizer)[0])


async def raw_stream(url: str, path: str, body: dict[str, Any], sid: str) -> list[bytes]:
    """The SSE frames of one streamed request, as the bytes arrive."""
    frames: list[bytes] = []
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}{path}", json={**body, "stream": True}, headers={"x-api-key": sid}
        ) as resp:
            assert resp.status == 200
            buffer = b""
            async for chunk in resp.content.iter_any():
                buffer += chunk
                *done, buffer = buffer.split(b"\n\n")
                frames.extend(done)
    return frames


def test_keepalives_go_out_while_the_engine_has_produced_nothing(tokenizer) -> None:
    fake = FakeSGLang(reply_for(tokenizer), first_token_s=1.0)
    chat = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi."}]}

    async def scenario(url: str, srv: Any):
        messages = await raw_stream(url, "/v1/messages", ANTHROPIC_BODY, "s-ka")
        completions = await raw_stream(url, "/v1/chat/completions", chat, "s-kb")
        responses = await raw_stream(url, "/v1/responses", {"model": "m", "input": "Hi."}, "s-kc")
        return messages, completions, responses

    messages, completions, responses = serve(
        fake, SGLangEngine, tokenizer, scenario, keepalive_s=0.2
    )
    pings = [f for f in messages if f.startswith(b"event: ping")]
    assert len(pings) >= 3
    # The pings come after message_start and before the first content.
    first_delta = next(i for i, f in enumerate(messages) if b"content_block_start" in f)
    assert all(messages.index(p) < first_delta for p in pings)
    assert messages[0].startswith(b"event: message_start")
    assert sum(f == b": keepalive" for f in completions) >= 3
    assert completions[-1] == b"data: [DONE]"
    # Responses keepalives are events (Codex's idle timeout does not count comments): the head
    # at once, then more `response.in_progress` until the output, numbered on throughout.
    events = [json.loads(f.split(b"data: ", 1)[1]) for f in responses]
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    first_item = kinds.index("response.output_item.added")
    assert kinds[2:first_item].count("response.in_progress") == first_item - 2 >= 3
    assert kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    ids = {e["response"]["id"] for e in events if "response" in e}
    assert ids == {events[-1]["response"]["id"]}


PLAIN_CHAT_BODY = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi."}]}
RESPONSES_BODY = {"model": "m", "input": "Run the tests."}
FAILING = {
    "anthropic": ("/v1/messages", ANTHROPIC_BODY),
    "chat": ("/v1/chat/completions", PLAIN_CHAT_BODY),
    "responses": ("/v1/responses", RESPONSES_BODY),
}


def failing_mid_stream(srv: Any) -> None:
    """The SGLang stand-in sends five tokens, then an error event (an engine fault)."""
    original = srv._stream

    async def failing(request, rid, n, event, *rest):
        def broken(a, b, last):
            if a >= 5:
                return {"error": {"message": "CUDA error: device-side assert"}}
            return event(a, b, last)

        return await original(request, rid, n, broken, *rest)

    srv._stream = failing


@pytest.mark.parametrize("wire", list(FAILING))
def test_an_engine_failing_after_the_200_is_an_error_event_and_logged_once(
    tokenizer, wire, caplog
) -> None:
    fake = FakeSGLang(reply_for(tokenizer))
    path, body = FAILING[wire]

    async def scenario(url: str, srv: Any):
        failing_mid_stream(srv)
        return await raw_stream(url, path, body, "s-err")

    with caplog.at_level("WARNING", logger="tokentrail"):
        frames = serve(fake, SGLangEngine, tokenizer, scenario)
    # Logged once, as a 5xx is: a WARNING with its reason, the session and the request id.
    logged = [r for r in caplog.records if "device-side assert" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    line = logged[0].getMessage()
    assert logged[0].levelname == "WARNING" and path in line and "session s-err" in line
    assert not any(r.exc_info for r in caplog.records)
    if wire == "anthropic":
        error = frames[-1].decode()
        assert error.startswith("event: error")
        data = json.loads(error.split("data: ", 1)[1])
        assert data["type"] == "error" and data["error"]["type"] == "api_error"
        assert "device-side assert" in data["error"]["message"]
    elif wire == "chat":
        data = json.loads(frames[-1].split(b"data: ", 1)[1])
        assert data["error"]["code"] == 502 and "device-side assert" in data["error"]["message"]
    else:
        # `response.failed`, with its event line, type and sequence number, the response
        # failed and its error: what Codex and the openai SDK read.
        head, payload = frames[-1].split(b"\n", 1)
        assert head == b"event: response.failed"
        event = json.loads(payload.split(b"data: ", 1)[1])
        events = [json.loads(f.split(b"data: ", 1)[1]) for f in frames]
        assert event["type"] == "response.failed"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert event["response"]["status"] == "failed"
        assert event["response"]["id"] == events[0]["response"]["id"]
        assert event["response"]["error"]["code"] == "server_error"
        assert "device-side assert" in event["response"]["error"]["message"]


def test_the_openai_sdk_reads_a_failed_responses_stream(tokenizer) -> None:
    fake = FakeSGLang(reply_for(tokenizer))

    async def scenario(url: str, srv: Any):
        failing_mid_stream(srv)
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="s-sdk", max_retries=0)
        stream = await client.responses.create(**RESPONSES_BODY, stream=True)
        return [event async for event in stream]

    events = serve(fake, SGLangEngine, tokenizer, scenario)
    assert events[-1].type == "response.failed"
    assert events[-1].response.status == "failed"
    assert events[-1].response.error is not None
    assert "device-side assert" in events[-1].response.error.message


async def read_until_stalled(resp: aiohttp.ClientResponse, quiet_s: float = 0.3) -> bytes:
    """What a stream sent until nothing more came for `quiet_s` (the engine stalled; the
    keepalive is further apart): a client that leaves then leaves with all sampled so far."""
    seen = b""
    while True:
        try:
            chunk = await asyncio.wait_for(resp.content.readany(), quiet_s)
        except asyncio.TimeoutError:
            return seen
        if not chunk:
            return seen
        seen += chunk


def test_a_client_gone_mid_stream_is_recorded_masked_and_its_retry_answered_fresh(
    tokenizer,
) -> None:
    ids, logprobs = sampled(tokenizer)
    fake = FakeSGLang(reply_for(tokenizer), stall_at=20)

    async def scenario(url: str, srv: Any):
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{url}/v1/messages",
                json={**ANTHROPIC_BODY, "stream": True},
                headers={"x-api-key": "s-gone"},
            ) as resp:
                seen = await read_until_stalled(resp)
                assert b"thinking_delta" in seen
        for _ in range(500):
            if srv.aborted:
                break
            await asyncio.sleep(0.01)
        aborted, rids = list(srv.aborted), list(srv.streamed)
        await asyncio.sleep(0.3)  # the partial turn is recorded in the background
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/metrics") as resp:
                metrics = await resp.text()
        srv.stall_at = None
        client = anthropic.AsyncAnthropic(base_url=url, api_key="s-gone", max_retries=0)
        retry = await client.messages.create(**ANTHROPIC_BODY)
        return aborted, rids, metrics, retry, await finished(url, "s-gone")

    aborted, rids, metrics, retry, done = serve(fake, SGLangEngine, tokenizer, scenario)
    assert aborted == rids[:1]  # the engine request, stopped by its rid
    assert "tokentrail_client_disconnects_total 1.0" in metrics
    partial, fresh = done["ledger"]["turns"]
    assert partial["generated"] == 20 and partial["trained"] == 0
    assert partial["masked"] == {"client_disconnected": 20}
    assert partial["superseded"] is True  # the retry was answered fresh
    assert fresh["generated"] == len(ids) and fresh["trained"] == len(ids)
    assert retry.content[-1].type == "tool_use"
    (sample,) = done["samples"]
    assert "client_disconnected" in json.dumps(done["ledger"])


def test_a_turn_cut_short_stays_masked_after_a_restart(tokenizer, tmp_path) -> None:
    """Journaled as cut short: the adapter restarted on its journal still masks it whole and
    trains nothing of it."""
    path = tmp_path / "j.db"
    fake = FakeSGLang(reply_for(tokenizer), stall_at=12)

    async def cut(url: str, srv: Any):
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{url}/v1/messages",
                json={**ANTHROPIC_BODY, "stream": True},
                headers={"x-api-key": "s-j"},
            ) as resp:
                assert b"thinking_delta" in await read_until_stalled(resp)
        for _ in range(500):
            if srv.aborted:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)

    first = Journal(path)
    serve(fake, SGLangEngine, tokenizer, cut, journal=first)
    first.close()

    async def finish(url: str, srv: Any):
        return await finished(url, "s-j")

    second = Journal(path)
    done = serve(FakeSGLang(reply_for(tokenizer)), SGLangEngine, tokenizer, finish, journal=second)
    second.close()
    (turn,) = done["ledger"]["turns"]
    assert turn["masked"] == {"client_disconnected": 12} and turn["trained"] == 0
    assert done["samples"] == []


def test_a_call_the_whole_parse_rejects_is_counted_as_a_stream_mismatch(tokenizer) -> None:
    """A call that looked well formed while sampled, then text after it: the call went out,
    the whole parse calls the output ill-formed, and the mismatch is counted."""
    text = format_output(MESSAGE, "hermes", "qwen3") + "\nand more text"
    ids = tokenizer.encode(text) + [IM_END]
    fake = FakeSGLang(lambda _prompt: (list(ids), [-0.5] * len(ids), "stop"))

    async def scenario(url: str, srv: Any):
        frames = await raw_stream(url, "/v1/messages", ANTHROPIC_BODY, "s-bad")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/metrics") as resp:
                return frames, await resp.text()

    frames, metrics = serve(fake, SGLangEngine, tokenizer, scenario)
    assert any(b'"type": "tool_use"' in f for f in frames)  # it went out as sampled
    assert frames[-1].startswith(b"event: message_stop")
    assert "tokentrail_stream_mismatches_total 1.0" in metrics
