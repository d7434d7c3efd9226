"""A resumed translation is the full one, on every request.

The request memo (`adapter.reuse`) translates only the wire messages after the last unchanged
one, from a mark the previous translation left (`protocols.resume`). Here: the reported case
(a mid-list `system` note that changes between requests), then a property test over request
sequences where earlier messages are edited, replaced, removed, re-typed, have `cache_control`
moved, and notes appear, change and disappear, for Anthropic, Chat Completions and Responses.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic

from tokentrail.adapter.server import Adapter, AdapterConfig, start_server
from tokentrail.engines.base import GenerateRequest, Generation
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.text.tokenizer import load_tokenizer

SCRIPT = [[{"type": "text", "text": "Hello."}]]


class _Recording(ScriptedEngine):
    """The scripted engine, keeping every prompt it is sent."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.prompts: list[list[int]] = []

    async def generate(self, req: GenerateRequest) -> Generation:
        self.prompts.append([int(i) for i in req.input_ids])
        return await super().generate(req)


def _decoded_prompts(bodies: list[dict[str, Any]], **config: Any) -> list[str]:
    """Each request's prompt as the engine saw it, decoded, sent with the anthropic SDK to an
    adapter on a real socket."""
    tokenizer = load_tokenizer()
    engine = _Recording(tokenizer, SCRIPT)
    adapter = Adapter(engine=engine, tokenizer=tokenizer, config=AdapterConfig(**config))

    async def play() -> None:
        runner, url = await start_server(adapter)
        try:
            client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
            for body in bodies:
                await client.messages.create(model="m", max_tokens=64, **body)
        finally:
            await runner.cleanup()

    asyncio.run(play())
    return [tokenizer.decode(ids) for ids in engine.prompts]


def test_a_system_note_that_changes_is_rendered_as_it_is_now() -> None:
    bodies = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": note}]}
        for note in ("NOTE-A", "NOTE-B")
    ]
    for memo in (256, 0):
        first, second = _decoded_prompts(bodies, request_memo=memo)
        assert first.count("NOTE-A") == 1 and "NOTE-B" not in first
        assert second.count("NOTE-B") == 1 and "NOTE-A" not in second, memo
