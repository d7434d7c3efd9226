"""Turns cut by `max_tokens`: how much of what was generated trains, spliced vs re-rendered.

One scripted session (tests/support/length_session.py) whose replies are cut mid-word, mid-call
and mid-thought at each `max_tokens`, its text sampled in pieces whose ids do not re-encode (as
a model's often do not). `splice` builds each prompt on the previous turn's sampled ids, the
cut ones too; `render` re-renders the history for every prompt (what a splice that falls back
at a cut turn did for each turn after it). Columns: cut turns, generated tokens, the trained
fraction of each side, tokens masked `realigned`, and the ratio of trained tokens.

    python benches/length_cut.py [--max-tokens 16,24,40,64]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.length_session import length_session  # noqa: E402
from tokentrail.text.tokenizer import load_tokenizer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", default="16,24,40,64")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    tokenizer = load_tokenizer()
    print(f"machine: {platform.machine()}, {platform.system()}, Python {platform.python_version()}")
    header = (
        f"{'max_tokens':>10} {'cut':>4} {'generated':>9} {'splice trained':>15} "
        f"{'render trained':>15} {'render realigned':>17} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for limit in (int(x) for x in args.max_tokens.split(",")):
        sides = {}
        for history in ("splice", "render"):
            trajectory, stops = asyncio.run(
                length_session(tokenizer, max_tokens=limit, history=history)
            )
            sides[history] = trajectory.ledger
        cut = sum(stop == "max_tokens" for stop in stops)
        splice, render = sides["splice"], sides["render"]
        generated = splice.generated_tokens
        ratio = splice.trained_tokens / max(render.trained_tokens, 1)
        print(
            f"{limit:>10} {cut:>4} {generated:>9} "
            f"{splice.trained_tokens / generated:>15.1%} "
            f"{render.trained_tokens / render.generated_tokens:>15.1%} "
            f"{render.masked_tokens.get('realigned', 0):>17} {ratio:>5.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
