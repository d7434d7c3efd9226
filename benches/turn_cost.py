"""What a late turn costs as the history grows: the adapter's in-process path at 16K, 64K and
128K tokens of context.

Each session (`sessions.py`: Claude Code's real tool list and echo rewrites, one tool call and
the same new text every turn, about 1,000 characters of tool output, so that a longer session
has more history, not bigger turns) is replayed through the adapter's own steps
(`sessions.replay_in_process`: request reader, prepare, record; the deferred splice check timed
apart), timed in process CPU. The slope is how much a late turn's CPU grows per 100 KB of
request body, between the shortest and the longest session, and the ratio of the two; the
same sessions with the request memo off show what reuse saves. The sessions are replayed in
rounds, each playing every session once, so the machine's load meets them alike.

    python benches/turn_cost.py [--turn-tokens 512] [--contexts 16384,65536,131072]
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import platform
import sys
import time

import numpy as np
from sessions import (
    TurnCosts,
    claude_code_tools,
    parsed_replies,
    record_session,
    replay_in_process,
)

from tokentrail.text.tokenizer import load_tokenizer


def _late(values: list[float]) -> np.ndarray:
    return np.array(values[len(values) // 2 :]) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turn-tokens", type=int, default=512, help="context added per turn")
    parser.add_argument("--contexts", default="16384,65536,131072")
    parser.add_argument("--repeats", type=int, default=3, help="replays per session (median)")
    args = parser.parse_args()
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    tokenizer = load_tokenizer()
    _, tools = claude_code_tools()
    print(
        f"about {args.turn_tokens} tokens added per turn, tools: {tools}; "
        "late turns = the second half of each session"
    )
    header = (
        "context",
        "turns",
        "body KB",
        "memo",
        "p50 ms",
        "p99 ms",
        "read",
        "prepare",
        "record",
    )
    print("".join(f"{h:>10}" for h in header) + f"{'after reply':>13}")
    print(
        "(process CPU ms, p50 of late turns unless named; after reply: p50 of the deferred "
        "checks x count)"
    )
    rows = []
    contexts = [int(c) for c in args.contexts.split(",")]
    sessions = {}
    for context in contexts:
        turns = record_session(tokenizer, context // args.turn_tokens, context)
        sessions[context] = (turns, parsed_replies(tokenizer, turns))
    # What the process holds before the first replay is frozen out of the collector's scans,
    # as `tokentrail serve` freezes its startup heap.
    gc.collect()
    gc.freeze()
    # Every session and memo setting replayed once per round, round after round: what the
    # machine's load does to one, it does to the others. A replay's adapter (its sessions)
    # is let go before the next one.
    played: dict[tuple[int, int], list[TurnCosts]] = {}
    for _ in range(args.repeats):
        for context in contexts:
            turns, replies = sessions[context]
            for memo in (256, 0):
                costs = replay_in_process(
                    tokenizer, turns, replies, request_memo=memo, clock=time.process_time
                )
                costs.adapter = None
                gc.collect()
                played.setdefault((context, memo), []).append(costs)
    for context in contexts:
        turns, replies = sessions[context]
        late_kb = float(np.mean([len(t.body) for t in turns[len(turns) // 2 :]]) / 1e3)
        for memo in (256, 0):
            # The replay whose late-turn p50 is the median of `--repeats` (this machine's
            # noise moves one replay's p50 by tens of percent).
            replays = played[(context, memo)]
            replays.sort(key=lambda c: float(np.percentile(_late(c.totals()), 50)))
            costs = replays[len(replays) // 2]
            total = _late(costs.totals())
            stages = [float(np.percentile(_late(x), 50)) for x in (costs.read, costs.prepare)]
            stages.append(float(np.percentile(_late(costs.record), 50)))
            # Deferred splice checks: only the turns that ran one.
            checks = [a for a in _late(costs.after) if a > 0.01]
            after = f"{np.percentile(checks, 50):.2f} x{len(checks)}" if checks else "-"
            p50, p99 = float(np.percentile(total, 50)), float(np.percentile(total, 99))
            cells = [f"{context // 1024}K", str(len(turns)), f"{late_kb:.0f}"]
            cells.append("on" if memo else "off")
            cells += [f"{v:.2f}" for v in (p50, p99, *stages)]
            print("".join(f"{c:>10}" for c in cells) + f"{after:>13}")
            rows.append((memo, late_kb, p50))
    for memo in (256, 0):
        points = [(kb, p50) for m, kb, p50 in rows if m == memo]
        (kb0, t0), (kb1, t1) = points[0], points[-1]
        slope = (t1 - t0) / ((kb1 - kb0) / 100) if kb1 > kb0 else float("nan")
        # The same ratio round by round (each round played every session once).
        rounds = [
            float(np.percentile(_late(b.totals()), 50) / np.percentile(_late(a.totals()), 50))
            for a, b in zip(played[(contexts[0], memo)], played[(contexts[-1], memo)], strict=True)
        ]
        print(
            f"memo {'on' if memo else 'off'}: late-turn p50 grows {slope:.2f} ms per 100 KB "
            f"of body ({kb0:.0f} -> {kb1:.0f} KB); {contexts[-1] // 1024}K / "
            f"{contexts[0] // 1024}K: {t1 / t0:.2f}x (by round, in play order: "
            + ", ".join(f"{r:.2f}x" for r in rounds)
            + ")"
        )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores (load average {load} at the "
        f"end), {platform.python_implementation()} {platform.python_version()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
