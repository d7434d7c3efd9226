"""Request fields checked as the official APIs check them (the types of the `anthropic` and
`openai` SDKs' request params): each bad shape is a 400 in the protocol's error shape naming
the field, over a real socket; the shapes harnesses and the SDKs send still pass."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from support.field_shapes import REFUSED, SERVED, M
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.engines.scripted import ScriptedEngine


def test_each_bad_field_is_a_400_naming_it_and_the_good_ones_pass(tokenizer) -> None:
    adapter = Adapter(engine=ScriptedEngine(tokenizer), tokenizer=tokenizer, config=AdapterConfig())

    async def post(http, url, path, body, headers, sid):
        h = {"Content-Type": "application/json", "Authorization": f"Bearer {sid}", **headers}
        if "x-api-key" in headers and "Authorization" not in headers:
            h.pop("Authorization")
        async with http.post(url + path, data=json.dumps(body), headers=h) as resp:
            raw = await resp.read()
            streamed = resp.content_type == "text/event-stream"
            return resp.status, raw.decode() if streamed else json.loads(raw)

    async def main():
        runner, url = await start_server(adapter)
        try:
            async with aiohttp.ClientSession() as http:
                refused = [
                    await post(http, url, path, body, headers, f"bad-{i}")
                    for i, (path, body, headers, _) in enumerate(REFUSED)
                ]
                served = [
                    await post(http, url, path, body, headers, f"good-{i}")
                    for i, (path, body, headers) in enumerate(SERVED)
                ]
            return refused, served
        finally:
            await runner.cleanup()

    refused, served = asyncio.run(main())
    wrong = []
    for (path, _, _, named), (status, payload) in zip(REFUSED, refused, strict=True):
        if path.startswith(M):  # Anthropic's error shape
            ok = (
                payload.get("type") == "error"
                and payload["error"]["type"] == "invalid_request_error"
            )
        else:  # OpenAI's
            ok = payload["error"]["type"] == "invalid_request_error"
        message = payload["error"]["message"]
        if status != 400 or not ok or named not in message:
            wrong.append((path, named, status, message))
    assert not wrong
    assert len(REFUSED) >= 43
    bad = [(p, b, s, r) for (p, b, _), (s, r) in zip(SERVED, served, strict=True) if s != 200]
    assert not bad
    # A refused request leaves no session behind; every served one is recorded.
    assert {s for s in adapter.sessions.open_ids() if s.startswith("bad-")} == set()
    expected = {
        h.get("x-api-key", f"good-{i}") for i, (_, _, h) in enumerate(SERVED)
    }  # the case with two equal credentials runs in their session
    assert set(adapter.sessions.open_ids()) == expected


def test_an_unknown_display_preference_is_served_and_counted_not_refused(tokenizer) -> None:
    # Claude Code 2.1.332's first request of every conversation, in its default configuration.
    # The value changes how reasoning is shown, not what is sampled: served, and counted so an
    # operator sees a harness sending what this adapter does not know.
    adapter = Adapter(engine=ScriptedEngine(tokenizer), tokenizer=tokenizer, config=AdapterConfig())
    body = {
        "model": "m",
        "max_tokens": 64,
        "thinking": {"type": "adaptive", "display": "updates"},
        "messages": [{"role": "user", "content": "hi"}],
    }
    known = {**body, "thinking": {"type": "adaptive", "display": "omitted"}}
    changes_sampling = {**body, "thinking": {"type": "sometimes", "display": "updates"}}

    async def main():
        runner, url = await start_server(adapter)
        try:
            async with aiohttp.ClientSession() as http:
                out = []
                for sent in (body, body, known, changes_sampling):
                    headers = {"Authorization": "Bearer cc", "Content-Type": "application/json"}
                    async with http.post(f"{url}{M}", json=sent, headers=headers) as resp:
                        out.append((resp.status, await resp.json()))
                count = f"{M}/count_tokens"
                async with http.post(f"{url}{count}", json=body, headers=headers) as resp:
                    out.append((resp.status, await resp.json()))
                async with http.get(f"{url}/metrics") as resp:
                    metrics = await resp.text()
            return out, metrics
        finally:
            await runner.cleanup()

    replies, metrics = asyncio.run(main())
    assert [status for status, _ in replies] == [200, 200, 200, 400, 200]
    assert replies[0][1]["type"] == "message"
    assert "thinking.type" in replies[3][1]["error"]["message"]
    # Three requests sent "updates" (two turns and a count); "omitted" is known.
    line = 'tokentrail_unknown_field_values_total{field="thinking.display"} 3.0'
    assert line in metrics.splitlines()
