"""What each harness rewrite costs, with echo restore on and off, and under each rewrite policy.

Simulated coding sessions (the `simulated` engine, Qwen3 vocabulary) drive the adapter over
loopback HTTP, once per behaviour switch on top of plain Claude Code echo re-rendering, and with
every switch on. Columns: samples per session, trained fraction of generated tokens, Edit /
Write / Bash turns trained, masked tokens by reason.

    python benches/harness_behaviours.py [--sessions 6] [--steps 8]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from tokentrail.sim.harness import Behaviour, SessionSpec, simulate
from tokentrail.text.tokenizer import load_tokenizer

TOOLS = ("Edit", "Write", "Bash")
BASE = Behaviour()
ROWS: dict[str, Behaviour] = {
    "claude code echoes": BASE,
    "verify-on-stop (user nudge)": replace(BASE, verify_on_stop=True),
    "verify, system nudge": replace(BASE, verify_on_stop=True, nudge_role="system"),
    "verify, nudge stripped+merged": replace(BASE, verify_on_stop=True, strip_nudge=True),
    "verify, full answer dropped": replace(
        BASE, verify_on_stop=True, strip_nudge=True, drop_full_answer=True
    ),
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


@dataclass
class Totals:
    sessions: int = 0
    samples: int = 0
    generated: int = 0
    trained: int = 0
    turns: Counter[str] = field(default_factory=Counter)
    turns_trained: Counter[str] = field(default_factory=Counter)
    masked: Counter[str] = field(default_factory=Counter)

    def add(self, trajectory: Any) -> None:
        ledger = trajectory.ledger
        self.sessions += 1
        self.samples += len(trajectory.samples)
        self.generated += ledger.generated_tokens
        self.trained += ledger.trained_tokens
        self.masked.update(ledger.masked_tokens)
        for tool, row in ledger.by_tool.items():
            self.turns[tool] += row["turns"]
            self.turns_trained[tool] += row["turns_trained"]

    def cells(self) -> list[str]:
        share = 100.0 * self.trained / self.generated if self.generated else 0.0
        masked = ", ".join(f"{k}={v}" for k, v in sorted(self.masked.items())) or "-"
        return [
            f"{self.samples / self.sessions:.1f}",
            f"{share:.1f}%",
            *(f"{self.turns_trained[t]}/{self.turns[t]}" for t in TOOLS),
            masked,
        ]


async def measure(
    tokenizer: Any, behaviour: Behaviour, restore: str, policy: str, sessions: int, steps: int
) -> Totals:
    totals = Totals()
    for seed in range(sessions):
        spec = SessionSpec(seed=seed, steps=steps, tasks=2, context_tokens=4000)
        protocol = "anthropic" if seed % 2 == 0 else "openai"
        run = await simulate(
            tokenizer,
            behaviour=behaviour,
            spec=spec,
            protocol=protocol,
            restore=restore,
            rewrite_policy=policy,
        )
        totals.add(run.trajectory)
    return totals


def table(rows: list[tuple[str, Totals]], title: str) -> str:
    head = ["behaviour", "samples/session", "trained", *(f"{t} turns" for t in TOOLS), "masked"]
    widths = [34, 16, 9, 11, 11, 11, 0]
    lines = [title, "".join(h.ljust(w) if w else h for h, w in zip(head, widths, strict=True))]
    for name, totals in rows:
        cells = [name, *totals.cells()]
        lines.append("".join(c.ljust(w) if w else c for c, w in zip(cells, widths, strict=True)))
    return "\n".join(lines)


async def main(sessions: int, steps: int) -> None:
    tokenizer = load_tokenizer()
    print(
        f"harness behaviours: {sessions} sessions x {steps} steps x 2 tasks each, "
        "anthropic/openai alternating, simulated engine, builtin:qwen3"
    )
    for restore in ("on", "off"):
        rows = [
            (name, await measure(tokenizer, b, restore, "merge", sessions, steps))
            for name, b in ROWS.items()
        ]
        print()
        print(table(rows, f"restore {restore}, rewrite_policy=merge"))
    print()
    rows = []
    for policy in ("merge", "fork"):
        for restore in ("on", "off"):
            totals = await measure(
                tokenizer, ROWS["all combined"], restore, policy, sessions, steps
            )
            rows.append((f"{policy}, restore {restore}", totals))
    print(table(rows, "rewrite policy, all behaviours combined"))
    print()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )


if __name__ == "__main__":
    # The per-session lost-signal warnings would interleave with the table.
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.steps))
