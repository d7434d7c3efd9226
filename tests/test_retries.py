"""Retried requests: answered with the recorded reply (same bytes, same output ids, nothing
generated or recorded twice), unless the harness asks for a fresh sample, which then
supersedes the first; durable across a restart through the journal."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.sim.harness import CLAUDE_CODE_TOOLS, SYSTEM_PROMPT, SessionSpec
from tokentrail.sim.model import SimulatedEngine
from tokentrail.storage.journal import Journal


class CountingEngine(SimulatedEngine):
    """The simulated model, which answers a repeated prompt differently (as sampling would),
    counting its calls; `gate` holds every call until it is set."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.calls = 0
        self.gate: asyncio.Event | None = None

    async def generate(self, req):
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        return await super().generate(req)


SYSTEM = f"{SYSTEM_PROMPT}\n{SessionSpec(seed=3, steps=3).plan(agent=False).marker()}"
BODY = {
    "model": "m",
    "max_tokens": 512,
    "system": SYSTEM,
    "messages": [{"role": "user", "content": "Refactor the modules."}],
    "tools": CLAUDE_CODE_TOOLS,
}


ADMIN = "retries-admin"


def adapter_for(tokenizer, journal: Journal | None = None, **config: Any) -> Adapter:
    config.setdefault("admin_token", ADMIN)
    return Adapter(
        engine=CountingEngine(tokenizer),
        tokenizer=tokenizer,
        config=AdapterConfig(**config),
        journal=journal,
    )


async def send(
    url: str, body: dict[str, Any], sid: str = "s", path: str = "/v1/messages", **headers: str
) -> tuple[int, bytes]:
    headers = {"x-api-key": sid, "Content-Type": "application/json", **headers}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}{path}", data=json.dumps(body), headers=headers) as resp:
            return resp.status, await resp.read()


async def finished(url: str, sid: str = "s") -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}/tokentrail/sessions/{sid}/finish",
            json={},
            headers={"Authorization": f"Bearer {ADMIN}"},
        ) as resp:
            return await resp.json()


def serve(adapter: Adapter, body):
    async def go():
        runner, url = await start_server(adapter)
        try:
            return await body(url)
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_a_retry_is_answered_with_the_recorded_reply(tokenizer) -> None:
    adapter = adapter_for(tokenizer)

    async def body(url: str):
        first = await send(url, BODY)
        again = await send(url, BODY)
        streamed = await send(url, {**BODY, "stream": True})
        return first, again, streamed, await finished(url)

    (s1, first), (s2, again), (s3, streamed), done = serve(adapter, body)
    assert s1 == s2 == s3 == 200
    assert again == first  # the same bytes: same message id, tool-call ids, content
    reply = json.loads(first)
    assert reply["id"] in streamed.decode()  # the same reply, framed as SSE
    assert adapter.engine.calls == 1
    (turn,) = done["ledger"]["turns"]
    assert turn["retries"] == 2 and turn["trained"] == turn["generated"]
    assert done["ledger"]["retries"] == 2 and len(done["samples"]) == 1
    assert reply["usage"]["output_tokens"] == turn["generated"]


def test_a_retry_whose_wire_body_differs_but_translates_the_same_is_a_retry(tokenizer) -> None:
    """Codex resends its body with the keys of `client_metadata` in another order."""
    adapter = adapter_for(tokenizer)
    openai_body = {
        "model": "m",
        "max_tokens": 256,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Go."}],
        "client_metadata": {"a": 1, "b": 2},
    }
    reordered = {"client_metadata": {"b": 2, "a": 1}, **dict(reversed(openai_body.items()))}

    async def body(url: str):
        path = "/v1/chat/completions"
        return await send(url, openai_body, path=path), await send(url, reordered, path=path)

    (_, first), (_, again) = serve(adapter, body)
    assert again == first and adapter.engine.calls == 1


def test_a_fresh_retry_supersedes_the_first_generation(tokenizer) -> None:
    adapter = adapter_for(tokenizer)

    async def body(url: str):
        first = await send(url, BODY)
        fresh = await send(url, BODY, **{"X-Tokentrail-Retry": "fresh"})
        done = await finished(url)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/metrics") as resp:
                return first, fresh, done, await resp.text()

    (_, first), (_, fresh), done, metrics = serve(adapter, body)
    assert fresh != first and adapter.engine.calls == 2
    old, new = done["ledger"]["turns"]
    assert old["superseded"] and old["masked"] == {"superseded": old["generated"]}
    assert old["trained"] == 0 and not new["superseded"] and new["trained"] == new["generated"]
    assert len(done["samples"]) == 1  # the superseded dead end is no sample
    assert 'tokentrail_retries_total{answer="generated"} 1.0' in metrics
    assert f'tokentrail_masked_tokens_total{{reason="superseded"}} {old["generated"]}.0' in metrics


def test_a_superseded_generation_can_train_when_asked(tokenizer) -> None:
    adapter = adapter_for(tokenizer, retry="fresh")
    adapter.manager.train_superseded = True

    async def body(url: str):
        await send(url, BODY)
        await send(url, BODY)
        return await finished(url)

    done = serve(adapter, body)
    old, new = done["ledger"]["turns"]
    assert old["superseded"] and old["trained"] == old["generated"] and len(done["samples"]) == 2


def test_changed_sampling_is_a_new_request(tokenizer) -> None:
    """Qwen Code resends a truncated tool call with `max_tokens` doubled."""
    adapter = adapter_for(tokenizer)

    async def body(url: str):
        await send(url, BODY)
        await send(url, {**BODY, "max_tokens": 1024})
        return await finished(url)

    done = serve(adapter, body)
    assert adapter.engine.calls == 2
    assert [t["superseded"] for t in done["ledger"]["turns"]] == [True, False]


def test_a_prompt_something_was_built_on_is_not_a_retry(tokenizer) -> None:
    adapter = adapter_for(tokenizer)

    async def body(url: str):
        _, first = await send(url, BODY)
        reply = json.loads(first)
        follow = {
            **BODY,
            "messages": [
                *BODY["messages"],
                {"role": "assistant", "content": reply["content"]},
                {"role": "user", "content": "And now?"},
            ],
        }
        await send(url, follow)
        await send(url, BODY)  # the harness went back to the start: a new sample
        return await finished(url)

    done = serve(adapter, body)
    assert adapter.engine.calls == 3
    assert not any(t["superseded"] or t["retries"] for t in done["ledger"]["turns"])


def test_a_duplicate_in_flight_waits_for_the_first(tokenizer) -> None:
    adapter = adapter_for(tokenizer)
    adapter.engine.gate = asyncio.Event()

    async def body(url: str):
        first = asyncio.create_task(send(url, BODY))
        while adapter.engine.calls < 1:
            await asyncio.sleep(0.01)
        second = asyncio.create_task(send(url, BODY))
        await asyncio.sleep(0.1)
        adapter.engine.gate.set()
        return await first, await second, await finished(url)

    (_, a), (_, b), done = serve(adapter, body)
    assert a == b and adapter.engine.calls == 1
    assert [t["retries"] for t in done["ledger"]["turns"]] == [1]


def test_an_unknown_retry_header_is_a_400(tokenizer) -> None:
    adapter = adapter_for(tokenizer)

    async def body(url: str):
        return await send(url, BODY, **{"X-Tokentrail-Retry": "maybe"})

    status, payload = serve(adapter, body)
    assert status == 400 and b"X-Tokentrail-Retry" in payload


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_lost_after_journaling_is_answered_after_a_restart(
    tokenizer, tmp_path: Path, stream: bool
) -> None:
    """The crash window: the turn is journaled, the process dies before the client reads the
    reply; the client's retry reaches the restarted adapter and gets that reply."""
    path = tmp_path / "j.db"
    first = adapter_for(tokenizer, Journal(path))
    lost: dict[str, Any] = {}
    original = first.turns._keep  # journaled, recorded and remembered; the reply not yet sent

    async def keep_then_die(*args: Any, **kwargs: Any):
        lost["answer"] = await original(*args, **kwargs)
        raise ConnectionResetError("the process died here")

    first.turns._keep = keep_then_die  # type: ignore[method-assign]

    async def crash(url: str):
        return await send(url, {**BODY, "stream": stream})

    status, _ = serve(first, crash)
    assert status == 499 and "answer" in lost
    first.journal.close()  # what a SIGKILL leaves: the journal as committed

    second = adapter_for(tokenizer, Journal(path))

    async def retry(url: str):
        return await send(url, BODY), await finished(url)

    (status, again), done = serve(second, retry)
    second.journal.close()
    assert status == 200 and json.loads(again) == lost["answer"].reply
    assert second.engine.calls == 0
    (turn,) = done["ledger"]["turns"]
    assert turn["retries"] == 1 and turn["trained"] == turn["generated"]


def test_an_empty_answer_is_never_answered_again(tokenizer) -> None:
    """Qwen Code resends the same body when it got an answer with no text and no tool call."""
    from tokentrail.engines.scripted import ScriptedEngine

    class EmptyFirst(ScriptedEngine):
        calls = 0

        def choose(self, req):
            EmptyFirst.calls += 1
            return [] if EmptyFirst.calls == 1 else [{"type": "text", "text": "Done now."}]

    adapter = Adapter(
        engine=EmptyFirst(tokenizer), tokenizer=tokenizer, config=AdapterConfig(admin_token=ADMIN)
    )

    async def body(url: str):
        return await send(url, BODY), await send(url, BODY), await finished(url)

    (_, empty), (_, again), done = serve(adapter, body)
    assert json.loads(empty)["content"] == [] and EmptyFirst.calls == 2
    assert json.loads(again)["content"][0]["text"] == "Done now."
    assert [t["superseded"] for t in done["ledger"]["turns"]] == [True, False]
