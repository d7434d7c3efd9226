"""Per-turn prompt preparation against a full render and encode; finish time and session memory.

Simulated coding sessions (32 and 128 turns; 16K, 64K and 128K-token final contexts; Qwen3
vocabulary) are recorded once through the adapter into a journal, then every turn is prepared
again in one process by both paths, on the same sessions:

- reference: restore, jinja render and a full `tokenizers` encode of every prompt;
- tokentrail: restore, render, splice (only the new messages are tokenized, incrementally when a
  turn falls back to a full render), the Rust store and builder.

Finish, samples and memory are tokentrail's alone: the comparison of finish and memory with
slime's own `TrajectoryManager` (which gives one sample per conversation, as tokentrail does)
is `benches/against_slime.py`. Memory is what a finished-to-be session holds: Python
allocations (tracemalloc) plus the Rust store's buffers, against the budget
2 x unique tokens x 9 bytes.

    python benches/session_scaling.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
from report import Report, machine

from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.messages import Conversation
from tokentrail.sim.harness import Behaviour, HarnessSim, SessionSpec
from tokentrail.sim.model import SimulatedEngine
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.read import read_journal
from tokentrail.storage.journal.record import JournaledTurn
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


def _build(name: str, tokenizer: LoadedTokenizer, turns: list[JournaledTurn]) -> tuple[Any, list]:
    """Prepare every turn as the path would (tokentrail also records it); return the manager
    and the turn times."""
    manager = TrajectoryManager()
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
            tokenizer.encode(pipeline.render(restored.render, turn.tools))
        times.append(time.perf_counter() - start)
    return manager, times


def run_path(name: str, tokenizer: LoadedTokenizer, turns: list[JournaledTurn]) -> dict[str, float]:
    sid = turns[0].sid
    manager, times = _build(name, tokenizer, turns)
    ms = np.array(times) * 1e3
    out = {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99))}
    if name != "tokentrail":
        return out
    start = time.perf_counter()
    samples = manager.finish(sid).samples
    out["finish_ms"] = (time.perf_counter() - start) * 1e3
    out["samples"] = len(samples)
    # Memory in a second pass: tracemalloc slows allocation, so it stays out of the timings.
    gc.collect()
    tracemalloc.start()
    baseline = tracemalloc.get_traced_memory()[0]
    manager, _ = _build(name, tokenizer, turns)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - baseline
    tracemalloc.stop()
    store = manager._sessions[sid].store  # noqa: SLF001 - measuring what it holds
    out["memory"] = held + store.heap_bytes()
    return out


def unique_tokens(turns: list[JournaledTurn]) -> int:
    """Ids a session really holds: each prompt's tail past its parent's tokens, plus outputs."""
    from tokentrail.core.reference import TurnStore

    store = TurnStore()
    for k, turn in enumerate(turns):
        store.push(k - 1, turn.prompt_ids, turn.output_ids, None)
    return sum(len(t) for t in store._tail) + sum(len(o) for o in store._output)  # noqa: SLF001


def main(quick: bool) -> None:
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    out = Report("session_scaling")
    tokenizer = load_tokenizer()
    grid = GRID[:2] if quick else GRID
    out.line("session scaling: per-turn prompt preparation (restore, render, tokenize, record)")
    out.line("reference = jinja render and a full encode of every prompt; finish, memory and")
    out.line("samples are tokentrail's (against slime's own manager: benches/against_slime.py)")
    head = (
        f"{'turns':>5} {'context':>8}{'ref p50':>9}{'tt p50':>8}{'ratio':>7}{'ref p99':>9}"
        f"{'tt p99':>8}{'ratio':>7}{'finish ms':>10}{'memory MB':>10}{'budget MB':>10}"
        f"{'samples':>8}"
    )
    out.line(head)
    for n_turns, context in grid:
        turns = record_session(tokenizer, n_turns, context)
        final = len(turns[-1].prompt_ids) + len(turns[-1].output_ids)
        budget = 2 * unique_tokens(turns) * 9
        ref, tt = (run_path(name, tokenizer, turns) for name in ("reference", "tokentrail"))
        out.line(
            f"{len(turns):>5} {final:>8}{ref['p50']:>9.2f}{tt['p50']:>8.2f}"
            f"{ref['p50'] / tt['p50']:>6.1f}x{ref['p99']:>9.2f}{tt['p99']:>8.2f}"
            f"{ref['p99'] / tt['p99']:>6.1f}x{tt['finish_ms']:>10.2f}{tt['memory'] / 1e6:>10.2f}"
            f"{budget / 1e6:>10.2f}{tt['samples']:>8}"
        )
    out.line(f"machine: {machine()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="only the 32-turn sessions")
    args = parser.parse_args()
    main(args.quick)
