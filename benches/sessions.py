"""Realistic recorded sessions for the benchmarks: what a Claude-Code-like harness sent (the raw
request bodies, pre-serialized) and what the model sampled, turn by turn.

A `HarnessSim` with Claude Code's echo rewrites and its real tool list (from
`../shared/fixtures`, when present; the simulator's own four tools otherwise) plays a coding
session against the adapter over the simulated model; the adapter's bodies and the engine's
outputs are captured in order. The sessions are reproducible from (turns, context, seed).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from tokentrail.adapter.server import Adapter, start_server
from tokentrail.engines.base import GenerateRequest, Generation
from tokentrail.sim.harness import CLAUDE_CODE_TOOLS, Behaviour, HarnessSim, SessionSpec
from tokentrail.sim.model import SimulatedEngine
from tokentrail.text.tokenizer import LoadedTokenizer

FIXTURE = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "fixtures"
    / "claude_code_2.1.197_edit_write_bash.json"
)


@dataclass
class RecordedTurn:
    """One request as the harness sent it, and the turn the model sampled for it."""

    body: bytes
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str


def claude_code_tools() -> tuple[list[dict[str, Any]], str]:
    """Claude Code 2.1.197's tool list as it sent it (24 tools), or the simulator's four."""
    if FIXTURE.exists():
        request = json.loads(FIXTURE.read_text())["exchanges"][0]["request"]
        return request["tools"], "Claude Code 2.1.197 (24 tools, fixture)"
    return CLAUDE_CODE_TOOLS, "simulator (5 tools; shared/fixtures missing)"


class _Recording(SimulatedEngine):
    def __init__(self, tokenizer: LoadedTokenizer) -> None:
        super().__init__(tokenizer)
        self.outputs: list[Generation] = []

    async def generate(self, req: GenerateRequest) -> Generation:
        generation = await super().generate(req)
        self.outputs.append(generation)
        return generation


async def _record(
    tokenizer: LoadedTokenizer, turns: int, context: int, seed: int
) -> list[RecordedTurn]:
    bodies: list[bytes] = []

    @web.middleware
    async def capture(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST" and request.path == "/v1/messages":
            bodies.append(await request.read())
        return await handler(request)

    engine = _Recording(tokenizer)
    adapter = Adapter(engine=engine, tokenizer=tokenizer)
    adapter.app.middlewares.insert(0, capture)
    runner, url = await start_server(adapter)
    try:
        tools, _ = claude_code_tools()
        spec = SessionSpec(seed=seed, steps=turns - 1, context_tokens=context, answer_words=40)
        await HarnessSim(url, "bench", behaviour=Behaviour(), spec=spec, tools=tools).run(
            "Refactor the modules and keep the tests green."
        )
    finally:
        await runner.cleanup()
    assert len(bodies) == len(engine.outputs), "every request was answered once"
    return [
        RecordedTurn(body, list(g.output_ids), list(g.logprobs), g.finish_reason)
        for body, g in zip(bodies, engine.outputs, strict=True)
    ]


def record_session(
    tokenizer: LoadedTokenizer, turns: int, context: int, seed: int = 7
) -> list[RecordedTurn]:
    """A session of `turns` requests growing to about `context` prompt tokens."""
    return asyncio.run(_record(tokenizer, turns, context, seed))
