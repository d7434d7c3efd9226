"""Readable dumps of a session's tree and of samples, tokens and loss mask aligned.

For eyes, not for parsing: `format_tree` shows how turns were routed, `format_sample` which
tokens a trainer will learn from.
"""

from __future__ import annotations

from collections.abc import Callable

from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.sample import Sample
from tokentrail.trajectory.tree import Node


def _label(node: Node) -> str:
    msg = node.message or {}
    text = msg.get("content")
    if not isinstance(text, str):
        text = str(text)
    text = text.replace("\n", "\\n")
    if len(text) > 40:
        text = text[:37] + "..."
    calls = [c.get("function", {}).get("name") for c in msg.get("tool_calls") or ()]
    label = f"{node.role}: {text!r}"
    if calls:
        label += f" calls={calls}"
    if node.turn is not None:
        label += f"  [turn {node.turn_index}: {node.turn.output_len} output ids]"
    for d in node.demoted:
        label += f"  [turn {d.turn_index} demoted by a rewrite]"
    return label


def format_tree(manager: TrajectoryManager, sid: str) -> str:
    """The session's routing tree, one node a line, indented by depth."""
    lines = [f"session {sid}: {manager.turn_count(sid)} turns"]
    stack: list[tuple[Node, int]] = [(c, 1) for c in reversed(manager.root(sid).children)]
    while stack:
        node, depth = stack.pop()
        lines.append("  " * depth + _label(node))
        stack.extend((c, depth + 1) for c in reversed(node.children))
    return "\n".join(lines)


def format_sample(sample: Sample, decode: Callable[[list[int]], str] | None = None) -> str:
    """Tokens with their loss mask and logprob, one row each; prompt rows marked `-`."""
    prompt = sample.prompt_length
    rows = [f"{'pos':>5} {'id':>8} {'mask':>4} {'logprob':>8}  text"]
    for pos, tok in enumerate(sample.tokens.tolist()):
        if pos < prompt:
            mask, lp = "-", ""
        else:
            mask = str(int(sample.loss_mask[pos - prompt]))
            lp = f"{float(sample.rollout_log_probs[pos - prompt]):.3f}"
        text = repr(decode([tok])) if decode else ""
        rows.append(f"{pos:>5} {tok:>8} {mask:>4} {lp:>8}  {text}")
    return "\n".join(rows)
