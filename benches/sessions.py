"""Realistic recorded sessions for the benchmarks: what a Claude-Code-like harness sent (the raw
request bodies, pre-serialized) and what the model sampled, turn by turn.

A `HarnessSim` with Claude Code's echo rewrites and its real tool list (from
`tests/fixtures`, when present; the simulator's own four tools otherwise) plays a coding
session against the adapter over the simulated model; the adapter's bodies and the engine's
outputs are captured in order. The sessions are reproducible from (turns, context, seed).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from tokentrail.adapter import Adapter, start_server
from tokentrail.engines.base import GenerateRequest, Generation
from tokentrail.sim.harness import CLAUDE_CODE_TOOLS, Behaviour, HarnessSim, SessionSpec
from tokentrail.sim.model import SimulatedEngine
from tokentrail.text.parsing import parse_output
from tokentrail.text.tokenizer import LoadedTokenizer
from tokentrail.trajectory.timing import TurnTiming

FIXTURE = (
    Path(__file__).resolve().parents[1]
    / "tests/fixtures"
    / "claude_code_2.1.197_edit_write_bash.json"
)


@dataclass
class RecordedTurn:
    """One request as the harness sent it, and the turn the model sampled for it."""

    body: bytes
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    routed_experts: None = None
    indexer_topk: None = None
    weight_versions: tuple[()] = ()
    discarded: tuple[()] = ()


def claude_code_tools() -> tuple[list[dict[str, Any]], str]:
    """Claude Code 2.1.197's tool list as it sent it (24 tools), or the simulator's four."""
    if FIXTURE.exists():
        request = json.loads(FIXTURE.read_text())["exchanges"][0]["request"]
        return request["tools"], "Claude Code 2.1.197 (24 tools, fixture)"
    return CLAUDE_CODE_TOOLS, "simulator (5 tools; tests/fixtures missing)"


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
        # The harness stops at 256 requests by default; a longer session asks for its turns.
        sim = HarnessSim(
            url,
            "bench",
            behaviour=Behaviour(),
            spec=spec,
            tools=tools,
            max_requests=max(256, turns),
        )
        await sim.run("Refactor the modules and keep the tests green.")
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
    """A session of `turns` requests growing to about `context` prompt tokens (each turn's
    tool result about `2 * context / turns` characters)."""
    return asyncio.run(_record(tokenizer, turns, context, seed))


@dataclass
class Sampled:
    """A recorded turn's sampled ids, as the pipeline's `record` takes them."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    # No replay data and no aborted attempts in these sessions (the pipeline reads all four).
    routed_experts: None = None
    indexer_topk: None = None
    weight_versions: tuple[()] = ()
    discarded: tuple[()] = ()


@dataclass
class TurnCosts:
    """Per-turn seconds of the adapter's in-process path over a recorded session."""

    # Body bytes to a checked, translated request (the adapter's `RequestReader`).
    read: list[float]
    # Restore, splice or render, encode (`TurnPipeline.prepare`).
    prepare: list[float]
    # The turn recorded (`TurnPipeline.record`).
    record: list[float]
    # Deferred splice checks, run after the reply (off the turn's path).
    after: list[float]
    # The adapter that played them (None once let go).
    adapter: Adapter | None

    def totals(self) -> list[float]:
        return [a + b + c for a, b, c in zip(self.read, self.prepare, self.record, strict=True)]


def replay_in_process(
    tokenizer: LoadedTokenizer,
    turns: list[RecordedTurn],
    replies: list[dict[str, Any]],
    sid: str = "s",
    request_memo: int = 256,
    clock: Callable[[], float] = time.perf_counter,
) -> TurnCosts:
    """Each recorded body through the adapter's own steps, in process and without HTTP: the
    request reader, the pipeline's prepare and record, then (timed apart) the deferred splice
    check the adapter runs after the reply. The engine is not called: the outputs are given.
    `clock`: wall time by default; `time.process_time` for the CPU the steps took (what a
    loaded machine's waits do not inflate)."""
    from tokentrail.adapter.config import AdapterConfig
    from tokentrail.adapter.protocols.anthropic import AnthropicMessages

    config = AdapterConfig(request_memo=request_memo, workers=0)
    adapter = Adapter(engine=SimulatedEngine(tokenizer), tokenizer=tokenizer, config=config)
    proto, headers = AnthropicMessages(), {"x-api-key": sid}
    pipeline = adapter.pipeline
    costs = TurnCosts([], [], [], [], adapter)
    for turn, reply in zip(turns, replies, strict=True):
        t0 = clock()
        request = adapter.requests.request(proto, turn.body, sid, headers)
        t1 = clock()
        prepared = pipeline.prepare(sid, request.conversation, timing=TurnTiming())
        t2 = clock()
        sampled = Sampled(turn.output_ids, turn.logprobs, turn.finish_reason)
        pipeline.record(prepared, sampled, reply)
        t3 = clock()
        pipeline.check_splice(sid)
        t4 = clock()
        costs.read.append(t1 - t0)
        costs.prepare.append(t2 - t1)
        costs.record.append(t3 - t2)
        costs.after.append(t4 - t3)
    return costs


def parsed_replies(tokenizer: LoadedTokenizer, turns: list[RecordedTurn]) -> list[dict[str, Any]]:
    end = tokenizer.end_token_ids
    out = []
    for t in turns:
        ids = [i for i in t.output_ids if i not in end]
        out.append(dict(parse_output(tokenizer.decode(ids)).message))
    return out
