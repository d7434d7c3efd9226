"""Echo restore, validated on the real code path: four configurations, one coding session.

A Claude-Code-style harness drives the adapter (scripted engine, Qwen3 vocabulary) through the
built-in session (`tokentrail.sim.validation`); the ledger and the drift decisions say what
happened. Rows 1 and 4 must agree; rows 2 and 3 show what is lost without restore
before render.

    python benches/echo_restore_table.py
"""

from __future__ import annotations

import logging
import platform

from tokentrail.sim.validation import TOOLS, Row, validation_table
from tokentrail.text.tokenizer import load_tokenizer


def format_table(rows: list[Row]) -> str:
    head = (
        f"{'configuration':<30}{'trained tokens':>16}"
        + "".join(f"{tool + ' trained':>15}" for tool in TOOLS)
        + f"{'merges':>8}  drift kinds"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.config:<30}{f'{r.trained}/{r.generated}':>16}"
            + "".join(f"{f'{a}/{b}':>15}" for a, b in (r.turns[t] for t in TOOLS))
            + f"{r.merges:>8}  {r.drifts or '-'}"
        )
    lines.append(
        f"machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, scripted engine, builtin:qwen3"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    # The per-session lost-signal warnings would interleave with the table.
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    print(format_table(validation_table(load_tokenizer())))
