"""Per-turn prompt preparation, finish time and session memory: tokentrail vs the reference path.

Simulated coding sessions (32 and 128 turns; 16K, 64K and 128K-token final contexts; Qwen3
vocabulary) are recorded once through the adapter into a journal, then every turn is prepared
again in one process by both paths, on the same sessions:

- reference: restore, jinja render, full `tokenizers` encode of the prompt, each turn's ids
  kept as Python lists, and a finish that merges turns by comparing list slices in C (a turn
  whose prompt starts with the sample so far extends it), as slime's `get_trajectory` does;
- tokentrail: restore, render, splice (only the new messages are tokenized, incrementally when a
  turn falls back to a full render), the Rust store and builder.

Memory is what a finished-to-be session holds: Python allocations (tracemalloc) plus the Rust
store's buffers, against the budget 2 x unique tokens x 9 bytes.

    python benches/session_scaling.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import platform
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from tokentrail.adapter.server import Adapter, AdapterConfig, start_server
from tokentrail.messages import Conversation
from tokentrail.sim.harness import Behaviour, HarnessSim, SessionSpec
from tokentrail.sim.model import SimulatedEngine
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.format import JournaledTurn
from tokentrail.storage.journal.read import read_journal
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.pipeline import TurnPipeline

GRID = [(32, 16_384), (32, 65_536), (32, 131_072), (128, 16_384), (128, 65_536), (128, 131_072)]


async def _record(tokenizer: LoadedTokenizer, turns: int, context: int, path: Path) -> None:
    adapter = Adapter(
        engine=SimulatedEngine(tokenizer),
        tokenizer=tokenizer,
        config=AdapterConfig(),
        journal=Journal(path),
    )
    runner, url = await start_server(adapter)
    try:
        spec = SessionSpec(seed=7, steps=turns - 1, context_tokens=context, answer_words=40)
        await HarnessSim(url, "bench", behaviour=Behaviour(), spec=spec).run("Refactor it all.")
        await adapter.finish_trajectory("bench")
    finally:
        await runner.cleanup()
        adapter.journal.close()


def record_session(tokenizer: LoadedTokenizer, turns: int, context: int) -> list[JournaledTurn]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "session.db"
        asyncio.run(_record(tokenizer, turns, context, path))
        return read_journal(path).served_turns()


class SliceSessions:
    """The reference's record and finish: token lists per turn, merged by slice compares."""

    def __init__(self) -> None:
        self.turns: dict[str, list[tuple[list[int], list[int]]]] = {}

    def record(self, sid: str, prompt_ids: list[int], output_ids: list[int]) -> None:
        self.turns.setdefault(sid, []).append((list(prompt_ids), list(output_ids)))

    def finish(self, sid: str) -> list[tuple[list[int], list[int]]]:
        """Samples as (tokens, loss mask): a turn extends the current sample when its prompt
        starts with it, else starts a new one."""
        samples: list[tuple[list[int], list[int]]] = []
        tokens: list[int] = []
        mask: list[int] = []
        for prompt, output in self.turns.pop(sid, []):
            if not tokens or prompt[: len(tokens)] != tokens:
                if tokens:
                    samples.append((tokens, mask))
                tokens, mask = [], []
            new = prompt[len(tokens) :]
            tokens = tokens + new + output
            mask = mask + [0] * len(new) + [1] * len(output)
        if tokens:
            samples.append((tokens, mask))
        return samples


def _build(name: str, tokenizer: LoadedTokenizer, turns: list[JournaledTurn]) -> tuple[Any, list]:
    """Prepare and record every turn as the path would; return what holds the session (the
    manager, or the reference's token lists) and the turn times."""
    manager = TrajectoryManager()
    reference = SliceSessions()
    # tokentrail: the adapter's own pipeline (restore, splice or incremental render, record).
    pipeline = TurnPipeline(manager, tokenizer)
    times = []
    for turn in turns:
        start = time.perf_counter()
        conversation = Conversation(turn.translated, turn.tools)
        if name == "tokentrail":
            prepared = pipeline.prepare(turn.sid, conversation)
            pipeline.record(prepared, turn, turn.response_message)
        else:
            # The reference: restore, jinja render and a full encode of every prompt.
            restored = pipeline.restored(turn.sid, conversation)
            ids = tokenizer.encode(pipeline.render(restored.render, turn.tools))
            reference.record(turn.sid, ids, list(turn.output_ids))
        times.append(time.perf_counter() - start)
    return (manager if name == "tokentrail" else reference), times


def run_path(name: str, tokenizer: LoadedTokenizer, turns: list[JournaledTurn]) -> dict[str, float]:
    sid = turns[0].sid
    manager, times = _build(name, tokenizer, turns)
    start = time.perf_counter()
    finished = manager.finish(sid)
    finish = time.perf_counter() - start
    samples = finished.samples if name == "tokentrail" else finished
    # Memory in a second pass: tracemalloc slows allocation, so it stays out of the timings.
    gc.collect()
    tracemalloc.start()
    baseline = tracemalloc.get_traced_memory()[0]
    manager, _ = _build(name, tokenizer, turns)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - baseline
    tracemalloc.stop()
    rust_bytes = 0
    if name == "tokentrail":
        store = manager._sessions[sid].store  # noqa: SLF001 - measuring what it holds
        rust_bytes = store.heap_bytes()
    ms = np.array(times) * 1e3
    return {
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "finish_ms": finish * 1e3,
        "memory": held + rust_bytes,
        "samples": len(samples),
    }


def unique_tokens(turns: list[JournaledTurn]) -> int:
    """Ids a session really holds: each prompt's tail past its parent's tokens, plus outputs."""
    from tokentrail.core.reference import TurnStore

    store = TurnStore()
    for k, turn in enumerate(turns):
        store.push(k - 1, turn.prompt_ids, turn.output_ids, None)
    return sum(len(t) for t in store._tail) + sum(len(o) for o in store._output)  # noqa: SLF001


def main(quick: bool) -> None:
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    tokenizer = load_tokenizer()
    grid = GRID[:2] if quick else GRID
    print("session scaling: per-turn prompt preparation (restore, render, tokenize, record),")
    print(
        "finish (linearize), session memory; reference = full encode, token lists, "
        "slice-compare finish (slime's get_trajectory)"
    )
    head = (
        f"{'turns':>5} {'context':>8} {'path':<11}{'prep p50 ms':>12}{'p99 ms':>9}"
        f"{'finish ms':>11}{'memory MB':>11}{'budget MB':>11}{'samples':>8}"
    )
    print(head)
    for n_turns, context in grid:
        turns = record_session(tokenizer, n_turns, context)
        final = len(turns[-1].prompt_ids) + len(turns[-1].output_ids)
        budget = 2 * unique_tokens(turns) * 9
        rows = {name: run_path(name, tokenizer, turns) for name in ("reference", "tokentrail")}
        for name, r in rows.items():
            print(
                f"{len(turns):>5} {final:>8} {name:<11}{r['p50']:>12.2f}{r['p99']:>9.2f}"
                f"{r['finish_ms']:>11.1f}{r['memory'] / 1e6:>11.2f}{budget / 1e6:>11.2f}"
                f"{r['samples']:>8}"
            )
        ref, tt = rows["reference"], rows["tokentrail"]
        print(
            f"{'':>5} {'':>8} {'ratio':<11}{ref['p50'] / tt['p50']:>11.1f}x"
            f"{ref['p99'] / tt['p99']:>8.1f}x{ref['finish_ms'] / tt['finish_ms']:>10.1f}x"
            f"{ref['memory'] / tt['memory']:>10.1f}x"
        )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="only the 32-turn sessions")
    args = parser.parse_args()
    main(args.quick)
