"""Routing replay on simulated MoE sessions: coverage, the rows on the wire, memory per session.

Simulated coding sessions (the `simulated` model, Qwen3 vocabulary) drive the adapter over
loopback HTTP with splicing and `routed_experts` on, each harness behaviour switch on top of
Claude Code's echo re-rendering. The engine answers for routed experts as an SGLang MoE server
does (`sim.moe`: rows per prefix, a cached prefix's rows as stored), with Qwen3-30B-A3B's shape
(48 layers, top-8 of 128 experts). Columns: sample tokens with their rows / all (the last token
of a sample excluded: nothing is computed from it), rows the engine sent vs what asking every
turn from position 0 would have sent, bytes per token in the store, and the session's store
with and without routing (bytes per token x tokens held).

    python benches/routing_replay.py [--sessions 4] [--steps 8]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
from dataclasses import dataclass, replace
from typing import Any

from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.core.routing import RoutingShape
from tokentrail.engines.base import GenerateRequest, Generation
from tokentrail.sim.harness import Behaviour, HarnessSim, SessionSpec
from tokentrail.sim.model import SimulatedEngine
from tokentrail.sim.moe import MoEEngine
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.manager import TrajectoryManager

SHAPE = RoutingShape(48, 8, 128)  # Qwen3-30B-A3B
BASE = Behaviour()
ROWS: dict[str, Behaviour] = {
    "claude code echoes": BASE,
    "sub-agents": replace(BASE, subagents=True),
    "compaction": replace(BASE, compaction=True),
    "retries": replace(BASE, retries=True),
    "reasoning stripped": replace(BASE, strip_reasoning=True),
    "all combined": replace(
        BASE,
        verify_on_stop=True,
        strip_nudge=True,
        subagents=True,
        compaction=True,
        retries=True,
        strip_reasoning=True,
    ),
}


class CountingMoE(MoEEngine):
    """Counts the rows sent, and the rows every request would have sent from position 0."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(SimulatedEngine(tokenizer))
        self.sent = 0
        self.from_zero = 0

    async def generate(self, req: GenerateRequest) -> Generation:
        gen = await super().generate(req)
        if gen.routed_experts is not None and gen.routed_experts.rows is not None:
            self.sent += len(gen.routed_experts.rows)
        self.from_zero += len(req.input_ids) + len(gen.output_ids) - 1
        return gen


@dataclass
class Run:
    tokens: int = 0
    present: int = 0
    sent: int = 0
    from_zero: int = 0
    held_routed: int = 0  # store bytes with routing
    held_plain: int = 0  # store bytes of the same session without
    routing_bytes: int = 0  # of which the routing rows
    turns: int = 0
    sessions: int = 0


async def play(tokenizer: Any, behaviour: Behaviour, spec: SessionSpec, routed: bool) -> Any:
    engine = CountingMoE(tokenizer)
    adapter = Adapter(
        engine=engine,
        tokenizer=tokenizer,
        manager=TrajectoryManager(routing=SHAPE if routed else None),
        config=AdapterConfig(routed_experts=routed),
    )
    runner, url = await start_server(adapter)
    try:
        sim = HarnessSim(url, "sim", behaviour=behaviour, spec=spec)
        await sim.run("Refactor the modules and keep the tests green.")
        session = adapter.manager._sessions["sim"]  # noqa: SLF001 - measuring what it holds
        # The adapter pools the rows (`trajectory.replay_pool`): the store holds their numbers.
        pooled = 0 if session.rows is None else session.rows.heap_bytes
        store = session.store
        held, nbytes = store.heap_bytes() + pooled, store.nbytes() + pooled
        turns = len(store)
        trajectory = await adapter.finish_trajectory("sim", reward=1.0)
    finally:
        await runner.cleanup()
    return trajectory, engine, held, nbytes, turns


async def measure(tokenizer: Any, behaviour: Behaviour, sessions: int, steps: int) -> Run:
    run = Run()
    for seed in range(sessions):
        spec = SessionSpec(seed=seed, steps=steps, tasks=2, context_tokens=6000)
        trajectory, engine, held, nbytes, turns = await play(tokenizer, behaviour, spec, True)
        _, _, plain_held, plain_nbytes, _ = await play(tokenizer, behaviour, spec, False)
        coverage = trajectory.ledger.replay["routed_experts"]
        run.tokens += coverage.tokens
        run.present += coverage.present
        run.sent += engine.sent
        run.from_zero += engine.from_zero
        run.held_routed += held
        run.held_plain += plain_held
        run.routing_bytes += nbytes - plain_nbytes
        run.turns += turns
        run.sessions += 1
    return run


async def main(sessions: int, steps: int) -> None:
    tokenizer = load_tokenizer()
    print(
        f"routing replay: {sessions} sessions x {steps} steps x 2 tasks, splice, simulated MoE "
        f"engine {SHAPE.layers} layers x top-{SHAPE.top_k} of {SHAPE.num_experts} experts "
        f"({SHAPE.dtype} rows, {SHAPE.row_bytes} bytes per token)"
    )
    head = (
        f"{'behaviour':<22}{'coverage':>22}{'rows sent / from 0':>24}{'turns':>7}"
        f"{'tokens held':>13}{'MB/session':>12}{'(no routing)':>14}"
    )
    print(head)
    for name, behaviour in ROWS.items():
        r = await measure(tokenizer, behaviour, sessions, steps)
        coverage = f"{r.present}/{r.tokens} ({100 * r.present / max(1, r.tokens):.1f}%)"
        sent = f"{r.sent}/{r.from_zero} ({100 * r.sent / max(1, r.from_zero):.0f}%)"
        # Each position held: its row in the pool and the row's number (4 bytes) in the store.
        held_tokens = r.routing_bytes // (SHAPE.row_bytes + 4) // r.sessions
        print(
            f"{name:<22}{coverage:>22}{sent:>24}{r.turns / r.sessions:>7.1f}"
            f"{held_tokens:>13}{r.held_routed / r.sessions / 1e6:>12.2f}"
            f"{r.held_plain / r.sessions / 1e6:>14.2f}"
        )
    print(
        "tokens held: rows the store keeps per session, each position once; "
        "MB/session: the store's buffers (heap_bytes) with routing, and without"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )


if __name__ == "__main__":
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.steps))
