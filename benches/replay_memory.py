"""Open MoE sessions' replay rows against the memory budget: resident memory with K sessions
that each hold one 128K-token turn's routed experts at Qwen3-30B-A3B's shape (48 layers x
top-8 of 128 experts: 48 MiB of rows each), with the rows on the store's tapes (before) and
pooled within a budget (after: the sessions past it keep their rows in a file each).

Each configuration runs in a fresh process (as `serve` does, with `map_large_buffers`):
RSS at the start, with the K sessions open, its peak, the seconds one finish takes (the rows
read back into the sample), and RSS after every session finished.

    python benches/replay_memory.py [--sessions 8] [--tokens 131072] [--budget-mib 128]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

from tokentrail.adapter.http.memory import map_large_buffers, rss
from tokentrail.core.routing import ReplayRows, RoutingShape
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.turn import TurnRecord

SHAPE = RoutingShape(48, 8, 128)  # Qwen3-30B-A3B
MIB = 1 << 20


def peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child(sessions: int, tokens: int, budget: int | None, directory: str) -> dict[str, float]:
    map_large_buffers()
    manager = TrajectoryManager(routing=SHAPE, replay_memory=budget, replay_dir=directory)
    rng = np.random.default_rng(0)
    start = rss()
    for k in range(sessions):
        prompt = rng.integers(10, 150_000, tokens - 8, dtype=np.uint32)
        rows = rng.integers(0, SHAPE.num_experts, (tokens - 1, SHAPE.layers, SHAPE.top_k), np.uint8)
        manager.record_turn(
            f"s{k}",
            turn=TurnRecord(prompt, [7] * 8, "stop", routed_experts=ReplayRows(rows, 0)),
            prompt_messages=[{"role": "user", "content": f"task {k}"}],
            response_message={"role": "assistant", "content": "done"},
        )
        del prompt, rows
    open_rss = rss()
    pool = manager.replay_pool
    heap, spilled = (pool.heap_bytes, pool.spilled_bytes) if pool else (0, 0)
    seconds = []
    for k in range(sessions):
        began = time.perf_counter()
        (sample,) = manager.finish(f"s{k}").samples
        seconds.append(time.perf_counter() - began)
        assert sample.routed_experts is not None and len(sample.routed_experts) == tokens
        del sample
    return {
        "start": start,
        "open": open_rss,
        "peak": peak(),
        "after": rss(),
        "heap": heap,
        "spilled": spilled,
        "finish_s": sum(seconds) / len(seconds),
    }


def run(sessions: int, tokens: int, budget: int | None, directory: str) -> dict[str, float]:
    args = [sys.executable, __file__, "--child", "--sessions", str(sessions)]
    args += ["--tokens", str(tokens), "--dir", directory]
    if budget is not None:
        args += ["--budget-mib", str(budget / MIB)]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(sessions: int, tokens: int, budget_mib: float, directory: str) -> None:
    per_session = (tokens - 1) * SHAPE.row_bytes
    budget = int(budget_mib * MIB)
    print(
        f"replay rows of {sessions} open sessions, one {tokens}-token turn each, "
        f"{SHAPE.layers} layers x top-{SHAPE.top_k} of {SHAPE.num_experts} experts "
        f"({per_session / MIB:.1f} MiB of rows per session); files in {directory}"
    )
    rows = [
        ("before: rows on the store's tapes", None),
        ("after: pool, budget over all rows", sessions * per_session + MIB),
        (f"after: pool, budget {budget_mib:g} MiB", budget),
    ]
    head = (
        f"{'':<38}{'heap rows':>10}{'in files':>10}{'RSS start':>11}{'RSS open':>10}"
        f"{'per session':>12}{'peak':>8}{'finish s':>10}{'RSS after':>11}"
    )
    print(head)
    results = []
    for name, pool_budget in rows:
        r = run(sessions, tokens, pool_budget, directory)
        results.append(r)
        heap = r["heap"] if pool_budget is not None else sessions * per_session
        print(
            f"{name:<38}{heap / MIB:>8.0f}Mi{r['spilled'] / MIB:>8.0f}Mi"
            f"{r['start'] / MIB:>9.0f}Mi{r['open'] / MIB:>8.0f}Mi"
            f"{(r['open'] - r['start']) / sessions / MIB:>10.1f}Mi{r['peak'] / MIB:>6.0f}Mi"
            f"{r['finish_s']:>10.3f}{r['after'] / MIB:>9.0f}Mi"
        )
    before, after = results[0], results[2]
    grown = (before["open"] - before["start"], after["open"] - after["start"])
    print(
        f"RSS grown by the open sessions: {grown[0] / MIB:.0f} MiB before, {grown[1] / MIB:.0f} "
        f"MiB after ({grown[0] / max(grown[1], 1):.1f}x less); finish "
        f"{after['finish_s'] / before['finish_s']:.2f}x the time of rows on the tapes"
    )
    load = os.getloadavg()[0]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}, load average {load:.1f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=131_072)
    parser.add_argument("--budget-mib", type=float, default=128.0)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        budget = None if "--budget-mib" not in sys.argv else int(args.budget_mib * MIB)
        print(json.dumps(child(args.sessions, args.tokens, budget, args.dir)))
    else:
        main(args.sessions, args.tokens, args.budget_mib, args.dir)
