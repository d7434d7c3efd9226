"""What durability costs: journal appends with `synchronous=NORMAL` vs `FULL`.

Appends the turns of growing sessions (each prompt extends the last by a few hundred tokens)
and reports per-append latency and the bytes stored per turn.

    python benches/journal_durability.py [--turns 400]
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np

from tokentrail.storage.journal import Journal


def run(sync: str, turns: int, where: Path) -> dict[str, float]:
    path = where / f"{sync}.db"
    journal = Journal(path, sync=sync)
    rng = np.random.default_rng(0)
    held = np.empty(0, np.uint32)
    times = []
    for k in range(turns):
        prompt = np.concatenate([held, rng.integers(0, 150_000, 300, dtype=np.uint32)])
        output = rng.integers(0, 150_000, 120, dtype=np.uint32)
        start = time.perf_counter()
        journal.turn(
            "s",
            translated=[{"role": "tool", "content": "x" * 800}],
            prompt_messages=[{"role": "tool", "content": "x" * 800}],
            response_message={"role": "assistant", "content": "y" * 300},
            tools=None,
            prompt_ids=prompt,
            output_ids=output,
            logprobs=np.full(len(output), -0.5, np.float32),
            finish_reason="stop",
            ill_formed=False,
            metadata={"k": k},
        )
        times.append(time.perf_counter() - start)
        held = np.concatenate([prompt, output])
    journal.close()
    (stored,) = sqlite3.connect(path).execute("SELECT sum(length(payload)) FROM events").fetchone()
    ms = np.array(times) * 1e3
    return {
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "bytes_per_turn": stored / turns,
        "final_context": float(len(held)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        rows = {sync: run(sync, args.turns, Path(tmp)) for sync in ("normal", "full")}
    context = int(rows["normal"]["final_context"])
    print(f"journal appends: {args.turns} turns of one session, final context {context} tokens")
    print(f"{'synchronous':<12}{'append p50 ms':>15}{'p99 ms':>10}{'bytes/turn':>12}")
    for sync, r in rows.items():
        print(f"{sync:<12}{r['p50']:>15.3f}{r['p99']:>10.3f}{r['bytes_per_turn']:>12.0f}")
    ratio = rows["full"]["p50"] / rows["normal"]["p50"]
    print(f"FULL / NORMAL p50: {ratio:.1f}x")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )


if __name__ == "__main__":
    main()
