"""The adapter against requests an attacker (or a broken client or engine) would send: each is a
clear 4xx in its protocol's shape or a 502, never a 500, a hang, another session's data or a
session left behind."""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from support.fake_engines import IM_END, FakeSGLang
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.adapter.request.limits import Limits
from tokentrail.cli import main as cli_main
from tokentrail.engines.http import header_value
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.engines.sglang import SGLangEngine
from tokentrail.errors import TemplateError
from tokentrail.storage.journal import Journal

ADMIN = "admin-secret"
GOOD = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


def adapter_for(tokenizer, *, engine=None, journal=None, **config: Any) -> Adapter:
    config.setdefault("admin_token", ADMIN)
    return Adapter(
        engine=engine or ScriptedEngine(tokenizer),
        tokenizer=tokenizer,
        config=AdapterConfig(**config),
        journal=journal,
    )


@asynccontextmanager
async def serving(adapter: Adapter) -> AsyncIterator[Client]:
    runner, url = await start_server(adapter)
    try:
        async with aiohttp.ClientSession() as http:
            yield Client(url, http)
    finally:
        await runner.cleanup()


class Client:
    def __init__(self, url: str, http: aiohttp.ClientSession) -> None:
        self.url, self.http = url, http

    async def post(
        self, path: str, body: Any, sid: str | None = "s", headers: dict[str, str] | None = None
    ) -> tuple[int, Any, Any]:
        data = body if isinstance(body, str | bytes) else json.dumps(body)
        h = {"Content-Type": "application/json", **(headers or {})}
        if sid is not None:
            h["Authorization"] = f"Bearer {sid}"
        async with self.http.post(self.url + path, data=data, headers=h) as resp:
            return resp.status, await resp.json(content_type=None), resp.headers

    async def finish(
        self, sid: str, body: Any = "{}", token: str | None = ADMIN
    ) -> tuple[int, Any]:
        status, payload, _ = await self.post(f"/tokentrail/sessions/{sid}/finish", body, token)
        return status, payload


def message_of(payload: Any) -> str:
    return str(payload["error"]["message"])


def test_body_fields_never_move_a_request_into_another_session(tokenizer) -> None:
    adapter = adapter_for(tokenizer)

    async def body() -> None:
        async with serving(adapter) as c:
            assert (await c.post("/v1/chat/completions", GOOD, sid="carol"))[0] == 200
            for hijack in ({"user": "carol"}, {"metadata": {"session_id": "carol"}}):
                status, _, _ = await c.post("/v1/chat/completions", {**GOOD, **hijack}, "mallory")
                assert status == 200
            status, carol = await c.finish("carol")
            assert status == 200 and [t["retries"] for t in carol["ledger"]["turns"]] == [0]
            # Both landed in mallory's session: the second is a retry of the first there.
            status, mallory = await c.finish("mallory")
            assert status == 200 and [t["retries"] for t in mallory["ledger"]["turns"]] == [1]

    asyncio.run(body())


def test_session_from_body_is_an_opt_in_and_still_checked(tokenizer) -> None:
    adapter = adapter_for(tokenizer, session_from_body=True)

    async def body() -> None:
        async with serving(adapter) as c:
            status, _, _ = await c.post("/v1/chat/completions", {**GOOD, "user": "carol"}, "x")
            assert status == 200
            # A body-named session reaches the engine's headers: no CR/LF gets there.
            bad = {**GOOD, "user": "carol\r\nX-Injected: 1"}
            status, payload, _ = await c.post("/v1/chat/completions", bad, "x")
            assert status == 400 and "session id" in message_of(payload)
        assert adapter.manager.sessions() == ["carol"]

    asyncio.run(body())


def test_admin_routes_are_off_without_a_token_and_count_tokens_needs_a_key(tokenizer) -> None:
    adapter = adapter_for(tokenizer, admin_token=None)

    async def body() -> None:
        async with serving(adapter) as c:
            assert (await c.post("/v1/messages", GOOD, sid="victim"))[0] == 200
            for token in (None, "victim", ADMIN):
                status, payload = await c.finish("victim", token=token)
                assert status == 403 and "--admin-token" in message_of(payload)
            async with c.http.delete(f"{c.url}/tokentrail/sessions/victim") as resp:
                assert resp.status == 403
            status, payload, _ = await c.post("/v1/messages/count_tokens", GOOD, sid=None)
            assert status == 401 and payload["type"] == "error"
        # The in-process API still works, and the session was untouched.
        samples = await adapter.finish_session("victim")
        assert len(samples) == 1

    asyncio.run(body())


SURROGATES = {
    "messages[0].content": (
        "/v1/messages",
        '{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"\\ud800"}]}',
    ),
    "system": (
        "/v1/messages",
        '{"model":"m","max_tokens":5,"system":"a\\udfffb","messages":[{"role":"user","content":"x"}]}',
    ),
    "tools[0].name": (
        "/v1/messages",
        '{"model":"m","max_tokens":5,"tools":[{"name":"\\ud800","input_schema":{}}],'
        '"messages":[{"role":"user","content":"x"}]}',
    ),
    "user": (
        "/v1/chat/completions",
        '{"model":"m","user":"\\ud800","messages":[{"role":"user","content":"x"}]}',
    ),
    "messages[0].content ": (
        "/v1/messages/count_tokens",
        '{"model":"m","messages":[{"role":"user","content":"\\ud800"}]}',
    ),
    "messages[1].tool_calls[0].function.arguments.a": (
        "/v1/chat/completions",
        json.dumps(
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "f", "arguments": '{"a": "\\ud800"}'},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "r"},
                ],
            }
        ),
    ),
}


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_lone_surrogates_and_deep_nesting_are_400s_naming_the_field(tokenizer) -> None:
    adapter = adapter_for(tokenizer)
    deep_schema = json.dumps({**GOOD, "tools": [{"name": "t", "input_schema": _nested(400)}]})

    async def body() -> None:
        async with serving(adapter) as c:
            for field, (path, raw) in SURROGATES.items():
                status, payload, _ = await c.post(path, raw)
                assert status == 400, field
                assert message_of(payload).startswith(f"{field.strip()} holds a lone surrogate")
            status, payload, _ = await c.post("/v1/messages", "[" * 100_000 + "]" * 100_000)
            assert status == 400 and "nested deeper than 64" in message_of(payload)
            status, payload, _ = await c.post("/v1/messages", deep_schema)
            assert status == 400 and message_of(payload).startswith("tools[0].input_schema")
            # NaN and numbers past a double are not JSON.
            for raw in ('{"temperature": NaN}', '{"temperature": 1e400}'):
                status, payload, _ = await c.post("/v1/messages", raw)
                assert status == 400 and "not valid JSON" in message_of(payload)
        assert len(adapter.sessions) == 0 and adapter.manager.sessions() == []

    asyncio.run(body())


def test_admission_limits_are_clear_4xx_in_the_protocols_shape(tokenizer) -> None:
    limits = Limits(
        max_messages=3,
        max_tools=2,
        max_tool_schema_bytes=300,
        max_prompt_tokens=40,
        max_output_tokens=7,
        max_header_bytes=1024,
    )
    adapter = adapter_for(tokenizer, limits=limits)
    tool = {"name": "t", "input_schema": {"type": "object"}}

    async def body() -> None:
        async with serving(adapter) as c:
            many = {**GOOD, "messages": [{"role": "user", "content": "x"}] * 4}
            status, payload, _ = await c.post("/v1/messages", many)
            assert status == 400 and "too many messages: 4 > 3" in payload["error"]["message"]
            status, payload, _ = await c.post("/v1/messages", {**GOOD, "tools": [tool] * 3})
            assert status == 400 and "too many tools" in payload["error"]["message"]
            fat = {**GOOD, "tools": [{"name": "t", "input_schema": {"description": "x" * 400}}]}
            status, payload, _ = await c.post("/v1/messages", fat)
            assert status == 413 and "--max-tool-schema-bytes" in payload["error"]["message"]
            long = {**GOOD, "messages": [{"role": "user", "content": "word " * 200}]}
            status, payload, _ = await c.post("/v1/chat/completions", long)
            assert status == 400 and "prompt is too long" in payload["error"]["message"]
            # max_tokens past the limit is clamped, as an engine stops at its context anyway.
            status, reply, _ = await c.post("/v1/messages", {**GOOD, "max_tokens": 10**40})
            assert status == 200 and reply["usage"]["output_tokens"] == 7
            for bad in ({"temperature": -1}, {"top_p": 0}, {"top_k": 0}, {"seed": -5}):
                status, payload, _ = await c.post("/v1/messages", {**GOOD, **bad})
                assert status == 400 and payload["type"] == "error", bad
            async with c.http.get(f"{c.url}/healthz", headers={"X-Big": "a" * 2000}) as resp:
                assert resp.status == 431
                assert "malformed HTTP request" in (await resp.json())["error"]["message"]
        assert adapter.manager.sessions() == ["s"]

    asyncio.run(body())


def test_a_body_shorter_than_its_content_length_is_a_408(tokenizer) -> None:
    adapter = adapter_for(tokenizer, limits=Limits(body_timeout_s=0.3))

    async def body() -> None:
        async with serving(adapter) as c:
            host, port = c.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s\r\n"
                b'Content-Length: 100\r\n\r\n{"model":'
            )
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 408")
            writer.close()
            assert (await c.post("/v1/messages", GOOD))[0] == 200

    asyncio.run(body())


def test_turns_past_the_concurrency_limit_get_503_with_retry_after(tokenizer) -> None:
    adapter = adapter_for(tokenizer, limits=Limits(max_concurrent_turns=1))
    gate = asyncio.Event()
    generate = adapter.engine.generate

    async def slow(req):  # type: ignore[no-untyped-def]
        await gate.wait()
        return await generate(req)

    adapter.engine.generate = slow  # type: ignore[method-assign]

    async def body() -> None:
        async with serving(adapter) as c:
            first = asyncio.create_task(c.post("/v1/messages", GOOD, sid="a"))
            while not adapter.turn_slots.taken:
                await asyncio.sleep(0.01)
            status, payload, headers = await c.post("/v1/messages", GOOD, sid="b")
            assert status == 503 and headers["Retry-After"] == "1"
            assert payload["error"]["type"] == "overloaded_error"
            gate.set()
            assert (await first)[0] == 200
            assert (await c.post("/v1/messages", GOOD, sid="b"))[0] == 200

    asyncio.run(body())


def _engine_reply(fault: str, tokenizer):  # type: ignore[no-untyped-def]
    ids = tokenizer.encode("Sure.") + [IM_END]
    lps = [-0.5] * len(ids)
    if fault == "token_id":
        return lambda _ids: ([*ids[:-1], 10_000_000], lps, "stop")
    if fault == "negative_id":
        return lambda _ids: ([-1, *ids[1:]], lps, "stop")
    if fault == "logprob_nan":
        return lambda _ids: (ids, [math.nan, *lps[1:]], "stop")
    if fault == "logprob_positive":
        return lambda _ids: (ids, [5.0, *lps[1:]], "stop")
    if fault == "empty":
        return lambda _ids: ([], [], "length")
    assert fault == "too_long"
    return lambda _ids: ([ids[0]] * 1000, [-0.1] * 1000, "length")


@pytest.mark.parametrize(
    ("fault", "counted"),
    [
        ("token_id", "token_id"),
        ("negative_id", "token_id"),
        ("logprob_nan", "logprob"),
        ("logprob_positive", "logprob"),
        ("empty", "empty"),
        ("too_long", "too_long"),
    ],
)
def test_engine_output_is_checked_before_anything_is_recorded(tokenizer, fault, counted) -> None:
    async def body() -> None:
        async with FakeSGLang(_engine_reply(fault, tokenizer)) as fake:
            fake.truncate = False
            adapter = adapter_for(tokenizer, engine=SGLangEngine(fake.url, tokenizer))
            async with serving(adapter) as c:
                status, payload, _ = await c.post("/v1/messages", {**GOOD, "max_tokens": 16})
                assert status == 502 and "engine error" in message_of(payload)
                async with c.http.get(f"{c.url}/metrics") as resp:
                    metrics = await resp.text()
            assert fake.aborted, "no abort reached the engine"
            assert f'tokentrail_engine_errors_total{{fault="{counted}"}} 1.0' in metrics
            assert adapter.manager.sessions() == [] and len(adapter.sessions) == 0

    asyncio.run(body())


def test_rejected_requests_leave_no_session(tokenizer) -> None:
    adapter = adapter_for(tokenizer)

    async def body() -> None:
        async with serving(adapter) as c:
            for k in range(50):
                status, _, _ = await c.post(
                    "/v1/messages", {"max_tokens": -1, "messages": []}, sid=f"r{k}"
                )
                assert status == 400
                status, _, _ = await c.post("/v1/messages", {**GOOD, "top_p": 7}, sid=f"q{k}")
                assert status == 400
        assert len(adapter.sessions) == 0 and adapter.manager.sessions() == []
        assert adapter.offload.lanes == 0

    asyncio.run(body())


def test_idle_sessions_are_evicted_journaled_and_reported(tokenizer, tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.db")
    adapter = adapter_for(tokenizer, journal=journal, session_idle_ttl_s=0.05)

    async def body() -> None:
        async with serving(adapter) as c:
            assert (await c.post("/v1/messages", GOOD, sid="idle"))[0] == 200
            assert (await c.post("/v1/messages", GOOD, sid="busy"))[0] == 200
            await asyncio.sleep(0.1)
            assert (await c.post("/v1/messages", GOOD, sid="busy"))[0] == 200
            assert await adapter.sessions.sweep() == ["idle"]
            status, payload = await c.finish("idle")
            assert status == 410
            assert "evicted at 20" in message_of(payload)
            assert "1 recorded turns were not linearized" in message_of(payload)
            status, payload, _ = await c.post("/v1/messages", GOOD, sid="idle")
            assert status == 410 and payload["type"] == "error"
            async with c.http.get(f"{c.url}/metrics") as resp:
                assert "tokentrail_sessions_evicted_total 1.0" in await resp.text()
            assert (await c.finish("busy"))[0] == 200
        await adapter.offload.drain()

    asyncio.run(body())
    journal.close()
    drops = _events(tmp_path / "j.db", "drop")
    assert [(sid, data["evicted"]["turns"]) for sid, data in drops] == [("idle", 1)]


def _events(path, kind: str) -> list[tuple[str, dict]]:
    """The journal's events of one kind, as committed: (session, data)."""
    with closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT sid, payload FROM events WHERE kind = ? ORDER BY seq", (kind,))
        return [(sid, json.loads(payload)) for sid, payload in rows]


def test_finish_is_idempotent_then_410_and_refuses_bad_rewards(tokenizer, tmp_path) -> None:
    journal = Journal(tmp_path / "j.db")
    adapter = adapter_for(tokenizer, journal=journal, finish_retention_s=0.2)

    async def body() -> None:
        async with serving(adapter) as c:
            assert (await c.post("/v1/messages", GOOD))[0] == 200
            for bad in (
                '{"reward": NaN}',
                '{"reward": Infinity}',
                '{"metadata": {"n": "\\ud800"}}',
            ):
                status, payload = await c.finish("s", bad)
                assert status == 400, bad
            first = await c.finish("s", '{"reward": 1.0}')
            again = await c.finish("s", '{"reward": 0.0}')
            assert first[0] == again[0] == 200 and first[1] == again[1]
            assert first[1]["samples"][0]["reward"] == 1.0
            await asyncio.sleep(0.3)
            await adapter.sessions.sweep()
            status, payload = await c.finish("s")
            assert status == 410 and "--finish-retention" in message_of(payload)

    asyncio.run(body())
    journal.close()
    assert len(_events(tmp_path / "j.db", "finish")) == 1


def test_open_sessions_are_capped_with_a_retry_after(tokenizer) -> None:
    adapter = adapter_for(tokenizer, max_sessions=2)

    async def body() -> None:
        async with serving(adapter) as c:
            for sid in ("a", "b"):
                assert (await c.post("/v1/messages", GOOD, sid=sid))[0] == 200
            status, payload, headers = await c.post("/v1/messages", GOOD, sid="c")
            assert status == 503 and "--max-sessions" in message_of(payload)
            assert int(headers["Retry-After"]) > 0
            assert (await c.post("/v1/messages", GOOD, sid="a"))[0] == 200
            assert (await c.finish("a"))[0] == 200
            assert (await c.post("/v1/messages", GOOD, sid="c"))[0] == 200

    asyncio.run(body())


def test_half_open_connections_cannot_starve_real_turns(tokenizer) -> None:
    adapter = adapter_for(tokenizer, limits=Limits(max_connections=16))

    async def body() -> None:
        async with serving(adapter) as c:
            host, port = c.url.removeprefix("http://").split(":")
            idle = [await asyncio.open_connection(host, int(port)) for _ in range(200)]
            await asyncio.sleep(0.05)
            assert len(adapter.connections) <= 16
            for _ in range(3):
                assert (await c.post("/v1/messages", GOOD))[0] == 200
            for _, writer in idle:
                writer.close()

    asyncio.run(body())


BROKEN_TEMPLATE = "{% for i in range(1000000) %}x{% endfor %}{{ messages[0]['content'] }}"


def test_a_chat_template_that_fails_at_load_is_refused_at_startup(tokenizer, tmp_path) -> None:
    with pytest.raises(TemplateError, match="cannot render a one-message conversation"):
        Adapter(
            engine=ScriptedEngine(tokenizer), tokenizer=tokenizer, chat_template=BROKEN_TEMPLATE
        )
    template = tmp_path / "broken.jinja"
    template.write_text(BROKEN_TEMPLATE)
    assert cli_main(["serve", "--chat-template", str(template), "--port", "1"]) == 2


def test_control_characters_never_reach_an_engine_header() -> None:
    assert header_value("carol\r\nX-Injected: 1") == "carol__X-Injected: 1"
    assert header_value("plain-id_1") == "plain-id_1"


def test_a_body_of_many_values_parses_as_the_small_one_does() -> None:
    from tokentrail.adapter.request.parse import parse_body

    tools = [
        {"name": f"t{i}", "input_schema": {"type": "object", "x": [1, 2.5, None]}}
        for i in range(50)
    ]
    # Commas count as possible values: this body is parsed in Python steps, not one C call.
    body = {**GOOD, "tools": tools, "system": "a, b, " * 30_000}
    raw = json.dumps(body).encode()
    assert parse_body(raw, 64) == body == json.loads(raw)
    with pytest.raises(ValueError, match="tools.7..name holds a lone surrogate"):
        parse_body(raw.replace(b'"t7"', b'"\\udc00"'), 64)
    with pytest.raises(ValueError, match="nested deeper than 3 levels"):
        parse_body(raw, 3)


def test_a_template_that_insists_on_a_system_message_still_starts(tokenizer) -> None:
    template = (
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    adapter = Adapter(engine=ScriptedEngine(tokenizer), tokenizer=tokenizer, chat_template=template)
    assert adapter.pipeline.chat_template == template


SPIN = (
    "{%- for m in messages %}{%- if m['content'] is string and 'SPIN-NOW' in m['content'] %}"
    "{%- for i in range(100000) %}{%- for j in range(100000) %}{%- for k in range(100000) %}"
    "{%- endfor %}{%- endfor %}{%- endfor %}{%- endif %}{%- endfor %}"
)


def test_a_template_that_spins_on_one_request_is_stopped_by_the_render_budget(
    tokenizer, caplog
) -> None:
    """A template that loops (for years) only when a message holds a marker passes the startup
    checks; four such requests at once each get a 400 in their protocol's shape once the
    render budget is spent, another session's turn is served meanwhile, and a spinning
    session's next, ordinary request is served too: nothing of the refused ones was kept."""
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer),
        tokenizer=tokenizer,
        chat_template=SPIN + tokenizer.chat_template,
        config=AdapterConfig(admin_token=ADMIN, render_budget_s=0.5, workers=2),
    )
    spin = {**GOOD, "messages": [{"role": "user", "content": "SPIN-NOW please"}]}

    async def go() -> tuple[list[tuple[int, Any, Any]], tuple[int, Any, Any], Any, Any]:
        async with serving(adapter) as client:
            client.http._timeout = aiohttp.ClientTimeout(total=60)
            spins = [client.post("/v1/messages", spin, f"spin-{i}") for i in range(4)]
            *spun, calm = await asyncio.gather(*spins, client.post("/v1/messages", GOOD, "calm"))
            again = await client.post("/v1/messages", GOOD, "spin-0")
            chat = await client.post("/v1/chat/completions", {**spin, "model": "m"}, "spin-chat")
            return spun, calm, again, chat

    with caplog.at_level("WARNING"):
        spun, calm, again, chat = asyncio.run(go())
    for status, payload, _ in spun:
        assert status == 400, payload
        assert payload["type"] == "error"
        assert payload["error"]["type"] == "invalid_request_error"
        assert "render budget (0.5 s, --render-budget)" in message_of(payload)
    assert chat[0] == 400 and "render budget" in chat[1]["error"]["message"]
    assert calm[0] == 200 and again[0] == 200
    assert any("ran past its render budget" in r.getMessage() for r in caplog.records)
    # The refused requests left nothing: the spinning session holds only its ordinary turn.
    finished = asyncio.run(adapter.finish_trajectory("spin-0"))
    assert len(finished.ledger.turns) == 1
