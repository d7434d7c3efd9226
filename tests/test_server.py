"""The adapter over HTTP, driven by the official `anthropic` and `openai` SDKs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from support.fake_engines import FakeSGLang, FakeVLLM
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.adapter.config import SessionSettings
from tokentrail.adapter.request.limits import Limits
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.engines.sglang import SGLangEngine
from tokentrail.engines.vllm import VLLMEngine
from tokentrail.text.tokenizer import load_tokenizer

READ_TOOL = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {
        "type": "object",
        "properties": {"file_path": {"type": "string"}},
        "required": ["file_path"],
    },
}
SCRIPT = [
    [
        {"type": "thinking", "thinking": "Look first."},
        {"type": "text", "text": "Reading it."},
        {"type": "tool_use", "name": "Read", "input": {"file_path": "/repo/a.py"}},
    ],
    [{"type": "text", "text": "It says x = 1."}],
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(coro_fn())


@asynccontextmanager
async def serving(adapter: Adapter) -> AsyncIterator[str]:
    runner, url = await start_server(adapter)
    try:
        yield url
    finally:
        await runner.cleanup()


ADMIN = "admin-secret"


def scripted(tokenizer, script=SCRIPT, **config: Any) -> Adapter:
    config.setdefault("admin_token", ADMIN)
    return Adapter(
        engine=ScriptedEngine(tokenizer, script),
        tokenizer=tokenizer,
        config=AdapterConfig(**config),
    )


async def finish(url: str, sid: str, token: str | None = ADMIN, **body: Any) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}/tokentrail/sessions/{sid}/finish", json=body or None, headers=headers
        ) as resp:
            return resp.status, await resp.json()


def anthropic_client(url: str, sid: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key=sid, max_retries=0)


def openai_client(url: str, sid: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=sid, max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_sdk_tool_round_trip(tokenizer, stream: bool) -> None:
    adapter = scripted(tokenizer)

    async def body() -> None:
        async with serving(adapter) as url:
            client = anthropic_client(url, "sess-a")
            messages: list[dict[str, Any]] = [{"role": "user", "content": "what is in a.py?"}]
            kwargs = dict(model="m", max_tokens=512, system="be brief", tools=[READ_TOOL])
            if stream:
                async with client.messages.stream(messages=messages, **kwargs) as s:
                    first = await s.get_final_message()
            else:
                first = await client.messages.create(messages=messages, **kwargs)
            assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
            assert first.stop_reason == "tool_use"
            call = first.content[2]
            assert call.name == "Read" and call.input == {"file_path": "/repo/a.py"}
            assert first.content[0].thinking == "Look first."
            messages += [
                {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": call.id, "content": "x = 1"}
                    ],
                },
            ]
            second = await client.messages.create(messages=messages, **kwargs)
            assert second.content[0].text == "It says x = 1."
            assert second.stop_reason == "end_turn"
            assert second.usage.input_tokens > first.usage.input_tokens
            status, result = await finish(url, "sess-a", reward=1.0)
        assert status == 200
        (sample,) = result["samples"]
        assert sample["reward"] == 1.0
        ledger = result["ledger"]
        assert ledger["trained_tokens"] == ledger["generated_tokens"] > 0
        assert ledger["by_tool"]["Read"]["turns_trained"] == 1

    run(body)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_sdk_tool_round_trip(tokenizer, stream: bool) -> None:
    adapter = scripted(tokenizer)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "Read",
                "description": "Read a file",
                "parameters": READ_TOOL["input_schema"],
            },
        }
    ]

    async def body() -> None:
        async with serving(adapter) as url:
            client = openai_client(url, "sess-o")
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "what is in a.py?"},
            ]
            if stream:
                chunks = [
                    c
                    async for c in await client.chat.completions.create(
                        model="m",
                        messages=messages,
                        tools=tools,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                ]
                assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
                deltas = [c.choices[0].delta for c in chunks if c.choices]
                content = "".join(d.content or "" for d in deltas)
                calls = [tc for d in deltas for tc in d.tool_calls or ()]
                name = calls[0].function.name
                call_id = calls[0].id
                arguments = "".join(tc.function.arguments or "" for tc in calls)
                finish_reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            else:
                resp = await client.chat.completions.create(
                    model="m", messages=messages, tools=tools
                )
                msg = resp.choices[0].message
                content, finish_reason = msg.content, resp.choices[0].finish_reason
                (call,) = msg.tool_calls
                name, call_id, arguments = call.function.name, call.id, call.function.arguments
            assert content == "Reading it."
            assert finish_reason == "tool_calls"
            assert name == "Read" and json.loads(arguments) == {"file_path": "/repo/a.py"}
            messages += [
                {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": arguments},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call_id, "content": "x = 1"},
            ]
            second = await client.chat.completions.create(model="m", messages=messages)
            assert second.choices[0].message.content == "It says x = 1."
            status, result = await finish(url, "sess-o")
        assert status == 200
        ledger = result["ledger"]
        # The wire message drops the reasoning; the scripted turn 1 is then a rewrite that the
        # restore step recognizes only if nothing but whitespace and defaults differ. It
        # differs by the reasoning, so it is accounted for, never silently lost.
        assert ledger["generated_tokens"] == ledger["trained_tokens"] + sum(
            ledger["masked_tokens"].values()
        )
        assert len(ledger["turns"]) == 2

    run(body)


def test_count_tokens_is_the_real_count(tokenizer) -> None:
    adapter = scripted(tokenizer)
    request = {
        "model": "m",
        "system": "be brief",
        "messages": [{"role": "user", "content": "hello there"}],
        "tools": [READ_TOOL],
    }

    async def body() -> None:
        async with serving(adapter) as url:
            client = anthropic_client(url, "s")
            counted = await client.messages.count_tokens(**request)
        text = tokenizer.render_chat(
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "Read",
                        "parameters": READ_TOOL["input_schema"],
                        "description": "Read a file",
                    },
                }
            ],
        )
        assert counted.input_tokens == len(tokenizer.encode(text)) > 20

    run(body)


def test_health_and_models(tokenizer) -> None:
    async def body() -> None:
        async with serving(scripted(tokenizer, model_name="qwen3-test")) as url:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{url}/healthz") as resp:
                    assert resp.status == 200 and (await resp.json())["status"] == "ok"
            models = await openai_client(url, "s").models.list()
            assert [m.id for m in models.data] == ["qwen3-test"]
            # One model by id (hermes-agent probes it at start): the served one, as the SDK
            # reads it; any other id is a 404 in OpenAI's error shape.
            model = await openai_client(url, "s").models.retrieve("qwen3-test")
            assert (model.id, model.object) == ("qwen3-test", "model")
            with pytest.raises(openai.NotFoundError) as missing:
                await openai_client(url, "s").models.retrieve("gpt-unknown")
            assert missing.value.status_code == 404
            error = missing.value.body
            assert error["type"] == "not_found_error" and "gpt-unknown" in error["message"]
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{url}/v1/models/Qwen/Qwen3-8B") as resp:
                    assert resp.status == 404
                    assert "Qwen/Qwen3-8B" in (await resp.json())["error"]["message"]

    run(body)


async def post(url: str, path: str, data: bytes | str, sid: str = "s") -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {sid}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}{path}", data=data, headers=headers) as resp:
            return resp.status, await resp.json()


GOOD = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
BAD_ANTHROPIC = {
    "non-json": b"{not json",
    "not-an-object": b"[1, 2]",
    "invalid-utf8": b'{"messages": "\xff\xfe"}',
    "messages-not-list": json.dumps({**GOOD, "messages": "hi"}),
    "empty-messages": json.dumps({**GOOD, "messages": []}),
    "unknown-role": json.dumps({**GOOD, "messages": [{"role": "robot", "content": "x"}]}),
    "content-wrong-type": json.dumps({**GOOD, "messages": [{"role": "user", "content": 5}]}),
    "tools-wrong-type": json.dumps({**GOOD, "tools": {"name": "x"}}),
    "stream-wrong-type": json.dumps({**GOOD, "stream": "yes"}),
    "max-tokens-wrong-type": json.dumps({**GOOD, "max_tokens": "many"}),
    "orphan-tool-result": json.dumps(
        {
            **GOOD,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}],
                }
            ],
        }
    ),
}
BAD_OPENAI = {
    "unknown-role": json.dumps({"model": "m", "messages": [{"role": "robot", "content": "x"}]}),
    "orphan-tool": json.dumps(
        {"model": "m", "messages": [{"role": "tool", "tool_call_id": "c1", "content": "x"}]}
    ),
    "tools-wrong-type": json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"f": 1}]}
    ),
    "stream-wrong-type": json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": 1}
    ),
}


def test_bad_input_is_a_clear_4xx_and_harms_no_one(tokenizer) -> None:
    adapter = scripted(tokenizer, limits=Limits(max_body_bytes=4096))

    async def body() -> None:
        async with serving(adapter) as url:
            client = anthropic_client(url, "healthy")
            await client.messages.create(**GOOD)
            for name, data in BAD_ANTHROPIC.items():
                status, payload = await post(url, "/v1/messages", data, sid="healthy")
                assert status == 400, name
                assert payload["type"] == "error" and payload["error"]["message"], name
            for name, data in BAD_OPENAI.items():
                status, payload = await post(url, "/v1/chat/completions", data, sid="healthy")
                assert status == 400, name
                assert payload["error"]["message"], name
            big = json.dumps({**GOOD, "system": "x" * 10_000})
            status, payload = await post(url, "/v1/messages", big)
            assert status == 413 and "too large" in payload["error"]["message"]
            status, payload = await post(url, "/v1/messages", json.dumps(GOOD), sid="")
            assert status == 401
            # The healthy session goes on untouched.
            await client.messages.create(
                **{**GOOD, "messages": [{"role": "user", "content": "yo"}]}
            )
            status, result = await finish(url, "healthy")
        assert status == 200
        assert len(result["ledger"]["turns"]) == 2

    run(body)


def test_session_guards_and_admin(tokenizer) -> None:
    adapter = scripted(tokenizer, max_turns_per_session=1, admin_token="sekret")

    async def body() -> None:
        async with serving(adapter) as url:
            client = anthropic_client(url, "capped")
            await client.messages.create(**GOOD)
            with pytest.raises(anthropic.RateLimitError):
                await client.messages.create(**GOOD)
            status, _ = await finish(url, "capped", token=None)
            assert status == 401
            status, _ = await finish(url, "nobody", token="sekret")
            assert status == 404
            status, result = await finish(url, "capped", token="sekret")
            assert status == 200 and len(result["ledger"]["turns"]) == 1
            # A finished session refuses more turns with a status no SDK retries.
            with pytest.raises(anthropic.APIStatusError) as info:
                await client.messages.create(**GOOD)
            assert info.value.status_code == 410
            assert "finished or dropped" in info.value.message
            await anthropic_client(url, "other").messages.create(**GOOD)
            async with aiohttp.ClientSession() as http:
                headers = {"Authorization": "Bearer sekret"}
                async with http.delete(f"{url}/tokentrail/sessions/other", headers=headers) as r:
                    assert r.status == 200
                async with http.delete(f"{url}/tokentrail/sessions/other", headers=headers) as r:
                    assert r.status == 404

    run(body)


def test_prompt_over_the_context_limit_is_refused_without_generating(tokenizer) -> None:
    # The words the real APIs use, which harnesses compact on: a 400, never a 2xx with no turn.
    adapter = scripted(tokenizer, max_context_tokens=5)

    async def body() -> None:
        async with serving(adapter) as url:
            with pytest.raises(anthropic.BadRequestError, match="prompt is too long: 9 tokens"):
                await anthropic_client(url, "s").messages.create(**GOOD)
            with pytest.raises(openai.BadRequestError, match="maximum context length is 5"):
                await openai_client(url, "s").chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
        assert adapter.manager.turn_count("s") == 0

    run(body)


def test_in_process_sessions(tokenizer) -> None:
    adapter = scripted(tokenizer)

    async def body() -> None:
        adapter.open_session("trainer-1", SessionSettings(sampling_defaults={"max_new_tokens": 3}))
        async with serving(adapter) as url:
            request = {k: v for k, v in GOOD.items() if k != "max_tokens"}
            status, reply = await post(url, "/v1/messages", json.dumps(request), "trainer-1")
            assert status == 200 and reply["stop_reason"] == "max_tokens"
            assert reply["usage"]["output_tokens"] == 3
            samples = await adapter.finish_session("trainer-1", reward=0.5)
        assert len(samples) == 1 and samples[0].reward == 0.5
        assert samples[0].metadata["finish_reason"] == "length"

    run(body)


def test_open_sessions_only_refuses_a_session_nobody_opened(tokenizer) -> None:
    # An adapter behind a pool: a turn for a session placed elsewhere must not start a
    # second, partial session of the same name here.
    adapter = scripted(tokenizer, open_sessions_only=True)

    async def body() -> None:
        async with serving(adapter) as url:
            with pytest.raises(anthropic.NotFoundError, match="not opened on this adapter"):
                await anthropic_client(url, "elsewhere").messages.create(**GOOD)
            adapter.open_session("here")
            await anthropic_client(url, "here").messages.create(**GOOD)
        assert adapter.sessions.open_ids() == ["here"]
        assert adapter.manager.turn_count("elsewhere") == 0

    run(body)


def test_finish_waits_for_in_flight_turns(tokenizer) -> None:
    adapter = scripted(tokenizer)
    engine = adapter.engine
    original = engine.generate
    gate = asyncio.Event()

    async def slow_generate(req):
        await gate.wait()
        return await original(req)

    engine.generate = slow_generate  # type: ignore[method-assign]

    async def body() -> None:
        async with serving(adapter) as url:
            turn = asyncio.create_task(anthropic_client(url, "s").messages.create(**GOOD))
            while not (session := adapter.sessions.get("s")) or not session.in_flight:
                await asyncio.sleep(0.01)
            finishing = asyncio.create_task(adapter.finish_session("s"))
            await asyncio.sleep(0.05)
            assert not finishing.done()
            gate.set()
            await turn
            samples = await finishing
        assert len(samples) == 1

    run(body)


def _qwen_reply(tokenizer, text: str) -> Callable[[list[int]], tuple[list[int], list[float], str]]:
    ids = tokenizer.encode(text) + [tokenizer.token_id("<|im_end|>")]
    return lambda _input_ids: (ids, [-0.25] * len(ids), "stop")


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_real_engine_wire_formats(tokenizer, kind: str) -> None:
    fake_cls = FakeSGLang if kind == "sglang" else FakeVLLM
    engine_cls = SGLangEngine if kind == "sglang" else VLLMEngine
    text = 'Sure.\n<tool_call>\n{"name": "Read", "arguments": {"file_path": "a.py"}}\n</tool_call>'

    async def body() -> None:
        async with fake_cls(_qwen_reply(tokenizer, text)) as fake:
            adapter = Adapter(engine=engine_cls(fake.url, tokenizer), tokenizer=tokenizer)
            async with serving(adapter) as url:
                reply = await anthropic_client(url, "e").messages.create(**GOOD, tools=[READ_TOOL])
                assert reply.content[1].input == {"file_path": "a.py"}
                # a second turn continues the first: its prompt is spliced onto the held ids
                follow = [
                    *GOOD["messages"],
                    {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": reply.content[1].id,
                                "content": "x = 1",
                            }
                        ],
                    },
                ]
                await anthropic_client(url, "e").messages.create(
                    model="m", max_tokens=64, messages=follow, tools=[READ_TOOL]
                )
                key = "input_ids" if kind == "sglang" else "prompt"
                first_ids, second_ids = [
                    r.body[key] for r in fake.requests if r.body and key in r.body
                ]
                sampled = tokenizer.encode(text) + [tokenizer.token_id("<|im_end|>")]
                assert second_ids[: len(first_ids) + len(sampled)] == first_ids + sampled
                # engine failure: 502 with the engine's message, nothing recorded
                fake.mode = "fail"
                with pytest.raises(anthropic.APIStatusError) as info:
                    await anthropic_client(url, "e").messages.create(**GOOD)
                assert info.value.status_code == 502
                assert "CUDA out of memory" in str(info.value)
                assert adapter.manager.turn_count("e") == 2
                # client gives up mid-generation: abort reaches the engine, nothing recorded
                fake.mode = "hang"
                short = anthropic.AsyncAnthropic(
                    base_url=url, api_key="e", max_retries=0, timeout=0.5
                )
                with pytest.raises(anthropic.APITimeoutError):
                    await short.messages.create(**GOOD)
                for _ in range(100):
                    if fake.disconnected or getattr(fake, "aborted", None):
                        break
                    await asyncio.sleep(0.05)
                if kind == "sglang":
                    assert fake.aborted, "no /abort_request reached the engine"
                else:
                    assert fake.disconnected, "the engine never saw the request go away"
                assert adapter.manager.turn_count("e") == 2
            body_key = "input_ids" if kind == "sglang" else "prompt"
            (first, *_) = [r.body for r in fake.requests if r.body and body_key in r.body]
            assert first[body_key] == tokenizer.encode(
                tokenizer.render_chat(
                    [{"role": "user", "content": "hi"}],
                    tools=[
                        {
                            "type": "function",
                            "function": {
                                "name": "Read",
                                "parameters": READ_TOOL["input_schema"],
                                "description": "Read a file",
                            },
                        }
                    ],
                )
            )

    run(body)


def test_ill_formed_output_goes_back_as_text(tokenizer) -> None:
    broken = '<tool_call>\n{"name": "Read", "arguments": {oops}\n</tool_call>'

    async def body() -> None:
        async with FakeSGLang(_qwen_reply(tokenizer, broken)) as fake:
            adapter = Adapter(engine=SGLangEngine(fake.url, tokenizer), tokenizer=tokenizer)
            async with serving(adapter) as url:
                reply = await anthropic_client(url, "i").messages.create(**GOOD)
                assert reply.content[0].text == broken
            samples = await adapter.finish_session("i")
        assert samples[0].metadata["ill_formed"] is True

    run(body)


def test_metrics_endpoint_counts_what_happened(tokenizer) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    adapter = scripted(tokenizer)

    async def body() -> dict:
        async with serving(adapter) as url:
            client = anthropic_client(url, "m1")
            first = await client.messages.create(
                messages=[{"role": "user", "content": "go"}],
                model="m",
                max_tokens=256,
                tools=[READ_TOOL],
            )
            await post(url, "/v1/messages", b"{not json", sid="m1")
            await finish(url, "m1")
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{url}/metrics") as resp:
                    assert resp.status == 200
                    text = await resp.text()
        assert first.stop_reason == "tool_use"
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return samples

    m = run(body)
    assert m[("tokentrail_requests_total", (("protocol", "anthropic"), ("status", "200")))] == 1
    assert m[("tokentrail_requests_total", (("protocol", "anthropic"), ("status", "400")))] == 1
    assert m[("tokentrail_sessions_finished_total", ())] == 1
    assert (
        m[("tokentrail_generated_tokens_total", ())] == m[("tokentrail_trained_tokens_total", ())]
    )
    assert m[("tokentrail_generated_tokens_total", ())] > 0
    assert m[("tokentrail_stage_duration_seconds_count", (("stage", "engine"),))] == 1
    assert m[("tokentrail_requests_in_flight", ())] == 0


def test_claude_codes_probe_gets_an_empty_200(tokenizer) -> None:
    adapter = scripted(tokenizer)

    async def body() -> None:
        async with serving(adapter) as url, aiohttp.ClientSession() as http:
            async with http.head(f"{url}/api/hello") as resp:
                assert resp.status == 200
                assert await resp.read() == b""
            async with http.get(f"{url}/api/hello") as resp:
                assert resp.status == 405  # only the probe's method is answered

    run(body)
