"""What the shared-prefix (tree) layout saves: tokens as rows against tokens as a tree, and the
forward-pass time of a tiny Qwen3 over each row against one pass over the tree.

Sessions are simulated Claude Code sessions over loopback HTTP (`sim.harness`, the simulated
engine, builtin:qwen3, rewrite policy fork): one with two sub-agents and a compaction, a GRPO
group of 8 rollouts of one task (one plan, one group id, the engine sampling with a seed per
rollout), and every simulated harness behaviour of `benches/harness_behaviours.py`. The forward
pass is a transformers Qwen3 built from a config with seeded random weights (float32, CPU,
`sdpa`): rows one at a time (causal), the tree in one pass with its dense ancestor mask; the
transformer body only (the LM head costs the same per token on both sides). Every timed tree
pass is checked against the rows (max |hidden state difference|).

    python benches/tree_layout.py [--sessions 4] [--steps 8] [--context 4000]
        [--forward-context 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tokentrail.sim.harness import Behaviour, SessionSpec, simulate
from tokentrail.sim.model import SimulatedEngine
from tokentrail.storage.tree_pack import pack_tree
from tokentrail.text.families import resolve_family
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.layout_stats import TreeStats
from tokentrail.trajectory.prefix_tree import build_prefix_tree
from tokentrail.trajectory.sample import Sample

sys.path.insert(0, str(Path(__file__).parent))
from harness_behaviours import ROWS  # noqa: E402

TASK = "Refactor the modules and keep the tests green."


async def session(tokenizer: Any, steps: int, context: int) -> tuple[list[Sample], Any]:
    behaviour = replace(Behaviour(), subagents=True, compaction=True)
    spec = SessionSpec(seed=3, steps=steps, subagents=2, context_tokens=context)
    run = await simulate(tokenizer, behaviour=behaviour, spec=spec, rewrite_policy="fork")
    return run.trajectory.samples, run.result


async def group(tokenizer: Any, size: int, steps: int, context: int) -> list[Sample]:
    family = resolve_family(tokenizer, None)
    spec = SessionSpec(seed=11, steps=steps, context_tokens=context)
    samples: list[Sample] = []
    for k in range(size):
        run = await simulate(
            tokenizer,
            spec=spec,
            engine=SimulatedEngine(tokenizer, family, seed=k),
            session_id=f"rollout-{k}",
            group="task",
            rewrite_policy="fork",
            task=TASK,
        )
        samples += run.trajectory.samples
    return samples


async def behaviours(tokenizer: Any, sessions: int, steps: int, context: int) -> dict:
    out = {}
    for name, behaviour in ROWS.items():
        per_session = []
        for seed in range(sessions):
            spec = SessionSpec(seed=seed, steps=steps, tasks=2, context_tokens=context)
            run = await simulate(tokenizer, behaviour=behaviour, spec=spec, rewrite_policy="fork")
            per_session.append(run.trajectory.ledger.layout)
        out[name] = TreeStats(
            sum(s.rows for s in per_session),
            sum(s.row_tokens for s in per_session),
            sum(s.tree_tokens for s in per_session),
        )
    return out


def token_row(name: str, stats: TreeStats) -> str:
    saved = 100 * stats.saved_tokens / stats.row_tokens if stats.row_tokens else 0.0
    return (
        f"| {name} | {stats.rows} | {stats.row_tokens:,} | {stats.tree_tokens:,} | "
        f"{saved:.1f}% | {stats.ratio:.2f}x |"
    )


def tiny_qwen3(torch: Any, transformers: Any) -> Any:
    config = transformers.Qwen3Config(
        vocab_size=151_936,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=65_536,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(config).eval()


def forward_times(model: Any, torch: Any, samples: list[Sample], repeat: int) -> tuple[float, ...]:
    """Median seconds over `repeat`: every row alone, the tree in one pass; the max |diff|."""
    tree = build_prefix_tree(samples)
    batch = tree.to_torch()
    rows = [torch.from_numpy(s.tokens.astype(np.int64))[None] for s in samples]
    row_times, tree_times = [], []
    with torch.no_grad():
        for _ in range(repeat):
            start = time.perf_counter()
            alone = [model.model(input_ids=ids).last_hidden_state[0] for ids in rows]
            row_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            hidden = model.model(
                input_ids=batch["input_ids"],
                position_ids=batch["position_ids"],
                attention_mask=batch["attention_mask"],
            ).last_hidden_state[0]
            tree_times.append(time.perf_counter() - start)
    diff = max(
        float((hidden[torch.from_numpy(tree.row_path(r).astype(np.int64))] - a).abs().max())
        for r, a in enumerate(alone)
    )
    return float(np.median(row_times)), float(np.median(tree_times)), diff


async def main(args: argparse.Namespace) -> None:
    tokenizer = load_tokenizer("builtin:qwen3")
    one, result = await session(tokenizer, args.steps, args.context)
    grpo = await group(tokenizer, 8, args.steps, args.context)
    by_behaviour = await behaviours(tokenizer, args.sessions, args.steps, args.context)
    packed = pack_tree(grpo)
    print(
        f"tokens as rows vs as a tree: simulated sessions, {args.steps} steps, context "
        f"~{args.context} tokens, builtin:qwen3, rewrite policy fork"
    )
    print("| case | rows | row tokens | tree tokens | saved | rows/tree |")
    print("|---|---|---|---|---|---|")
    print(
        token_row(
            f"Claude Code-like session ({result.subagent_runs} sub-agents, "
            f"{result.compactions} compaction)",
            build_prefix_tree(one).stats,
        )
    )
    print(token_row("GRPO group of 8 rollouts of one task", packed.stats))
    per_session = packed.session_stats().values()
    print(
        token_row(
            "  the same 8, each session its own tree",
            TreeStats(
                sum(s.rows for s in per_session),
                sum(s.row_tokens for s in per_session),
                sum(s.tree_tokens for s in per_session),
            ),
        )
    )
    for name, stats in by_behaviour.items():
        print(token_row(f"{name} ({args.sessions} sessions x 2 tasks)", stats))

    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    model = tiny_qwen3(torch, transformers)
    print()
    print(
        "forward pass, tiny Qwen3 (4 layers, hidden 256, 4 heads / 2 KV, vocab 151,936, "
        f"float32, CPU, sdpa), transformer body, median of {args.repeat}"
    )
    print("| input | row tokens | rows: s | tree tokens | tree: s | rows/tree time | max diff |")
    print("|---|---|---|---|---|---|---|")
    # Smaller sessions: the dense mask and the attention scores grow with the tree squared.
    small, _ = await session(tokenizer, args.steps, args.forward_context)
    small_group = await group(tokenizer, 8, args.steps, args.forward_context)
    for name, samples in (
        (f"the session, context ~{args.forward_context}", small),
        (f"the GRPO group, context ~{args.forward_context}", small_group),
    ):
        stats = build_prefix_tree(samples).stats
        rows_s, tree_s, diff = forward_times(model, torch, samples, args.repeat)
        print(
            f"| {name} | {stats.row_tokens:,} | {rows_s:.3f} | {stats.tree_tokens:,} | "
            f"{tree_s:.3f} | {rows_s / tree_s:.2f}x | {diff:.1e} |"
        )
    print()
    load = os.getloadavg()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {load[0]:.1f} "
        f"(shared), torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )


if __name__ == "__main__":
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--context", type=int, default=4000)
    parser.add_argument("--forward-context", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
