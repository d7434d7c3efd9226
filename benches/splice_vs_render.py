"""Splice vs render: what re-rendering the history costs, per chat template and behaviour.

Simulated sessions (the `simulated` engine writes some tool calls as compact JSON, as real
models do) drive the adapter with each test template, building prompts by splicing sampled
tokens or by re-rendering everything. Columns: samples per session, trained fraction of
generated tokens, drift kinds, splice fallbacks.

    python benches/splice_vs_render.py [--sessions 4] [--steps 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from tokentrail.sim.harness import Behaviour, SessionSpec, simulate
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer

TEMPLATES = Path(__file__).resolve().parents[1] / "tests" / "templates"
BEHAVIOURS = {
    "claude code echoes": Behaviour(),
    "verify-on-stop": Behaviour(verify_on_stop=True),
    "reasoning stripped": Behaviour(strip_reasoning=True),
    "all combined": Behaviour(
        verify_on_stop=True,
        strip_nudge=True,
        subagents=True,
        compaction=True,
        retries=True,
        strip_reasoning=True,
    ),
}


def llama3(qwen: LoadedTokenizer, where: Path) -> LoadedTokenizer:
    """Llama-3 header tokens and template over the Qwen vocabulary, as a model dir."""
    tok = Tokenizer.from_str(qwen.tokenizer.to_str())
    tok.add_special_tokens(
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    )
    tok.save(str(where / "tokenizer.json"))
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "chat_template": (TEMPLATES / "llama3.jinja").read_text(),
    }
    (where / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(str(where))


async def measure(
    tokenizer: Any, template: str | None, behaviour: Behaviour, history: str, n: int, steps: int
) -> list[str]:
    samples = generated = trained = 0
    drifts: Counter[str] = Counter()
    fallbacks: Counter[str] = Counter()
    for seed in range(n):
        run = await simulate(
            tokenizer,
            behaviour=behaviour,
            spec=SessionSpec(seed=seed, steps=steps, tasks=2, think=0.7),
            chat_template=template,
            history=history,
            protocol="anthropic" if seed % 2 == 0 else "openai",
        )
        samples += len(run.trajectory.samples)
        generated += run.trajectory.ledger.generated_tokens
        trained += run.trajectory.ledger.trained_tokens
        drifts.update(run.trajectory.drift_counts)
        fallbacks.update(run.trajectory.ledger.splice_fallbacks)
    return [
        f"{samples / n:.1f}",
        f"{100.0 * trained / generated:.1f}%",
        ", ".join(f"{k}={v}" for k, v in sorted(drifts.items())) or "-",
        ", ".join(f"{k}={v}" for k, v in sorted(fallbacks.items())) or "-",
    ]


async def main(n: int, steps: int) -> None:
    qwen = load_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            "qwen3 (ChatML, tools)": (qwen, None),
            "qwen3, strips earlier <think>": (qwen, (TEMPLATES / "qwen3_strip_think.jinja")),
            "llama3 header tokens": (llama3(qwen, Path(tmp)), None),
            "extra tokens after end": (qwen, TEMPLATES / "extra_after_end.jinja"),
            "position-dependent": (qwen, TEMPLATES / "position_dependent.jinja"),
        }
        print(
            f"splice vs render: {n} sessions x {steps} steps x 2 tasks per cell, "
            "simulated engine (30% compact-JSON tool calls), anthropic/openai alternating"
        )
        widths = (31, 20, 8, 16, 9, 38, 0)
        head = (
            "template",
            "behaviour",
            "history",
            "samples/session",
            "trained",
            "drifts",
            "fallbacks",
        )
        print("".join(h.ljust(w) if w else h for h, w in zip(head, widths, strict=True)))
        for name, (tokenizer, path) in cases.items():
            template = path.read_text() if path else None
            for bname, behaviour in BEHAVIOURS.items():
                for history in ("splice", "render"):
                    cells = await measure(tokenizer, template, behaviour, history, n, steps)
                    row = (name, bname, history, *cells)
                    print("".join(c.ljust(w) if w else c for c, w in zip(row, widths, strict=True)))
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )


if __name__ == "__main__":
    # The per-session lost-signal warnings would interleave with the table.
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.steps))
