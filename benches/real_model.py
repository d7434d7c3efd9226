"""A real model in the loop: what a 10-turn coding session costs on the tiny models, with and
without the engine's per-session prefix reuse, and what the recompute audit finds.

Each tiny model (seeded random weights, real vocabulary) answers a simulated Claude Code session
(10 model turns, the context grown to about 20K tokens as Claude Code's system prompt and tool
schemas make it) teacher-forced on the simulated model's replies, twice: with the KV cache kept
between turns and with every prompt computed from scratch. Columns: wall seconds per session,
positions fed forward, positions served from the cache, and the audit of the samples (largest
|recomputed - rollout| logprob, routing match). Both runs must give the same samples.

    python benches/real_model.py [--models qwen3,qwen3-moe] [--threads 2] [--context 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time

import numpy as np

from tokentrail.engines.transformers_lm import TransformersEngine
from tokentrail.model.audit import recompute_samples
from tokentrail.model.forward import set_threads
from tokentrail.model.tiny import tiny_model
from tokentrail.sim.harness import SessionSpec, simulate
from tokentrail.sim.model import SimulatedEngine
from tokentrail.text.tokenizer import load_tokenizer


def run(name: str, reuse: bool, spec: SessionSpec) -> tuple[float, TransformersEngine, list]:
    path = tiny_model(name)
    tokenizer = load_tokenizer(str(path))
    engine = TransformersEngine(
        path, tokenizer, inner=SimulatedEngine(tokenizer), prefix_reuse=reuse
    )
    start = time.perf_counter()
    result = asyncio.run(simulate(tokenizer, engine=engine, spec=spec, routing=engine.routing))
    return time.perf_counter() - start, engine, result.trajectory.samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen3,qwen3-moe,llama3,deepseek-v3")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=20000)
    args = parser.parse_args()
    set_threads(args.threads)
    # Nine tool calls and the answer: ten model turns.
    spec = SessionSpec(seed=3, steps=9, context_tokens=args.context)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores ({args.threads} torch threads), "
        f"python {platform.python_version()}; session: 10 model turns, context ~{args.context}"
    )
    print(
        "| model | prefix reuse | session s | fed forward | from cache | off / on (s) | "
        "off / on (positions) | audit s | max abs err | routing match |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        run(name, True, SessionSpec(seed=0, steps=2, context_tokens=2000))  # warm up
        rows = []
        for reuse in (True, False):
            seconds, engine, samples = run(name, reuse, spec)
            start = time.perf_counter()
            report = recompute_samples(engine.lm, samples)
            audit_s = time.perf_counter() - start
            rows.append((reuse, seconds, engine, samples, report, audit_s))
        _, fast, fast_engine, fast_samples, _, _ = rows[0]
        _, slow, slow_engine, slow_samples, _, _ = rows[1]
        fed = slow_engine.computed_positions / max(1, fast_engine.computed_positions)
        same = len(fast_samples) == len(slow_samples) and all(
            np.array_equal(a.tokens, b.tokens) and np.array_equal(a.loss_mask, b.loss_mask)
            for a, b in zip(fast_samples, slow_samples, strict=True)
        )
        for reuse, seconds, engine, _, report, audit_s in rows:
            routing = f"{report.routing_share:.2%}" if report.routed_positions else "-"
            ratio = f"{slow / fast:.2f}x | {fed:.1f}x" if reuse else " | "
            print(
                f"| {name} | {'on' if reuse else 'off'} | {seconds:.1f} | "
                f"{engine.computed_positions} | {engine.cached_positions} | {ratio} | "
                f"{audit_s:.1f} | {report.max_error:.2e} | {routing} |"
            )
        if not same:
            print(f"MISMATCH: {name}'s samples differ with and without prefix reuse")


if __name__ == "__main__":
    main()
