"""What the shared-prefix (tree) layout saves: tokens as rows against tokens as a tree, and the
forward-pass time of a tiny Qwen3 over each row against one pass over the tree.

Sessions are simulated Claude Code sessions over loopback HTTP (`sim.harness`, the simulated
engine, builtin:qwen3, rewrite policy fork): one with two sub-agents and a compaction, a GRPO
group of 8 rollouts of one task (one plan, one group id, the engine sampling with a seed per
rollout), and every simulated harness behaviour of `benches/harness_behaviours.py`. The forward
pass is a transformers Qwen3 built from a config with seeded random weights (float32, CPU):
rows one at a time (causal `sdpa`), the tree in one pass with its dense ancestor mask (`sdpa`),
and the tree block by block (an attention function registered here: each block's queries
against its ancestors' keys and its own, what a block-sparse kernel computes); the transformer
body only (the LM head costs the same per token on both sides). Every timed tree pass is
checked against the rows (max |hidden state difference|).

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


# The block plan the `tree_blocks` attention reads: per block, its node range and the nodes of
# its ancestor blocks (a bench-side stand-in for a block-sparse kernel such as flex attention).
PLAN: list[tuple[int, int, Any]] = []


def block_plan(torch: Any, tree: Any) -> list[tuple[int, int, Any]]:
    offsets, parents = tree.block_offsets, tree.block_parent
    ancestors: list[list[int]] = []
    plan = []
    for b, p in enumerate(parents.tolist()):
        above = ancestors[p] + list(range(offsets[p], offsets[p + 1])) if p >= 0 else []
        ancestors.append(above)
        plan.append((int(offsets[b]), int(offsets[b + 1]), torch.tensor(above, dtype=torch.long)))
    return plan


def tree_blocks(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kw: Any):
    """Attention block by block: a block's queries against its ancestors' keys and its own
    (causal), so no score outside the tree is computed. query `[1, H, N, D]`, key/value
    `[1, KV, N, D]`; returns `[1, N, H, D]` as transformers' attention functions do."""
    import torch

    repeat = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(repeat, 1), value.repeat_interleave(repeat, 1)
    out = torch.empty_like(query)
    for start, end, above in PLAN:
        n, a = end - start, len(above)
        mask = torch.ones(n, a + n, dtype=torch.bool)
        mask[:, a:] = torch.ones(n, n, dtype=torch.bool).tril()
        out[:, :, start:end] = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, start:end],
            torch.cat([key[:, :, above], key[:, :, start:end]], 2),
            torch.cat([value[:, :, above], value[:, :, start:end]], 2),
            attn_mask=mask,
            scale=kw.get("scaling"),
        )
    return out.transpose(1, 2).contiguous(), None


def tiny_qwen3(torch: Any, transformers: Any, attention: str = "sdpa") -> Any:
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
        attn_implementation=attention,
    )
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(config).eval()


def forward_times(
    model: Any, blocked: Any, torch: Any, samples: list[Sample], repeat: int
) -> tuple[float, ...]:
    """Median seconds over `repeat`: every row alone, the tree in one pass (dense mask), the
    tree block by block; the max |hidden difference| of each tree pass against the rows."""
    tree = build_prefix_tree(samples)
    batch = tree.to_torch()
    PLAN[:] = block_plan(torch, tree)
    rows = [torch.from_numpy(s.tokens.astype(np.int64))[None] for s in samples]
    row_times, tree_times, block_times = [], [], []
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
            start = time.perf_counter()
            by_block = blocked.model(
                input_ids=batch["input_ids"],
                position_ids=batch["position_ids"],
                # Any 4-D mask: transformers then passes it through; `tree_blocks` ignores it.
                attention_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool),
            ).last_hidden_state[0]
            block_times.append(time.perf_counter() - start)
    paths = [torch.from_numpy(tree.row_path(r).astype(np.int64)) for r in range(len(rows))]
    diff = max(float((hidden[p] - a).abs().max()) for p, a in zip(paths, alone, strict=True))
    block_diff = max(
        float((by_block[p] - a).abs().max()) for p, a in zip(paths, alone, strict=True)
    )
    return (
        float(np.median(row_times)),
        float(np.median(tree_times)),
        float(np.median(block_times)),
        max(diff, block_diff),
    )


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
    transformers.AttentionInterface.register("tree_blocks", tree_blocks)
    model = tiny_qwen3(torch, transformers)
    blocked = tiny_qwen3(torch, transformers, "tree_blocks")
    print()
    print(
        "forward pass, tiny Qwen3 (4 layers, hidden 256, 4 heads / 2 KV, vocab 151,936, "
        f"float32, CPU, sdpa), transformer body, median of {args.repeat}"
    )
    print(
        "| input | row tokens | rows: s | tree tokens | blocks | tree, dense mask: s | "
        "rows/tree | tree, by block: s | rows/tree | max diff |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    # Smaller sessions: the dense mask and the attention scores grow with the tree squared.
    small, _ = await session(tokenizer, args.steps, args.forward_context)
    small_group = await group(tokenizer, 8, args.steps, args.forward_context)
    for name, samples in (
        (f"the session, context ~{args.forward_context}", small),
        (f"the GRPO group, context ~{args.forward_context}", small_group),
    ):
        tree = build_prefix_tree(samples)
        stats = tree.stats
        rows_s, tree_s, block_s, diff = forward_times(model, blocked, torch, samples, args.repeat)
        print(
            f"| {name} | {stats.row_tokens:,} | {rows_s:.3f} | {stats.tree_tokens:,} | "
            f"{len(tree.block_parent)} | {tree_s:.3f} | {rows_s / tree_s:.2f}x | {block_s:.3f} | "
            f"{rows_s / block_s:.2f}x | {diff:.1e} |"
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
