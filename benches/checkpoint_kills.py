"""Checkpoint and random kills: a journal writer SIGKILLed over and over over long sessions.

Writer after writer on one journal (`tests/support/journal_writer.py`: sessions appended turn
by turn round robin, each turn its predecessor's prompt and output plus 1,500 new ids, a
`PRAGMA wal_checkpoint(TRUNCATE)` every N commits), each SIGKILLed either on reading `ckpt`
(inside the checkpoint, unless it returned first) or after a random number of commits, until
the sessions are done. After every kill the journal is read and compared with what the writer
acknowledged: turns kept, acknowledged turns missing, turns that differ from what was written,
sessions with more turns than written, turns stated lost. `benches/kill_sweep.py` kills the
whole server inside the journal -> reply window; this kills the journal's own writes.

    python benches/checkpoint_kills.py [--sessions 4] [--turns 100] [--kills 60]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.journal_writer import WIDTH, Kills, kill_rounds, verify  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--kills", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=4)
    parser.add_argument("--seed", type=int, default=35)
    args = parser.parse_args()
    started = time.monotonic()
    totals = {"missing": 0, "differ": 0, "too_many": 0, "stated_lost": 0}
    worst: dict[str, int] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        path = Path(tmp) / "run.db"

        def after_each(kills: Kills) -> None:
            found = verify(path, kills.acked, args.turns)
            for key in totals:
                totals[key] += found[key]
            worst.update(kept=found["kept"])

        plans = ["checkpoint", "random"] * (args.kills // 2)
        # The sessions must outlast the kills: a writer that reaches the end stops the sweep.
        kills = kill_rounds(
            path,
            [*plans, "end"],
            sessions=args.sessions,
            turns=args.turns,
            every=args.checkpoint_every,
            rng=random.Random(args.seed),
            after_each=after_each,
        )
        size = path.stat().st_size
    acked = sum(k + 1 for k in kills.acked.values())
    print(
        f"checkpoint kills: {args.sessions} sessions x {args.turns} turns (the last prompt "
        f"{args.turns * WIDTH + (args.turns - 1) * 8:,} ids), a checkpoint every "
        f"{args.checkpoint_every} commits; journal {size / 1e6:.1f} MB"
    )
    rows = [
        ("kills inside a checkpoint", f"{kills.inside_checkpoint} of {kills.checkpoint}"),
        ("kills after random commits", str(kills.random)),
        ("writer reached the end", "yes" if kills.finished else "no (the kills ran out first)"),
        ("turns acknowledged", f"{acked:,}"),
        ("turns kept at the end", f"{worst.get('kept', 0):,}"),
        ("acknowledged turns missing (all checks)", str(totals["missing"])),
        ("turns kept but different", str(totals["differ"])),
        ("sessions past their turns (duplicated)", str(totals["too_many"])),
        ("turns stated lost (no damage was done)", str(totals["stated_lost"])),
    ]
    width = max(len(name) for name, _ in rows) + 2
    for name, value in rows:
        print(f"{name:<{width}}{value:>24}")
    print(
        f"{time.monotonic() - started:.0f} s; machine: {platform.machine()}, {os.cpu_count()} "
        f"cores, {platform.python_implementation()} {platform.python_version()}"
    )


if __name__ == "__main__":
    main()
