"""What the viewer shows of one session, as JSON: its ledger, its tree drawn as turns and
branch points (each branch labelled with why it branched), and one turn's tokens with the fate
of each (trained, or masked by the ledger's reason), its logprob, weight version and replay row.

Everything is computed from a session's tree, its turn store and its linearization, the three
things a journal replay and a live adapter both hold; a turn's tokens only when it is opened.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tokentrail.kinds import BranchReason, MaskReason
from tokentrail.messages import Message, tool_names
from tokentrail.trajectory.ledger import Ledger, TurnLedger
from tokentrail.trajectory.linearize import Trajectory
from tokentrail.trajectory.restore import EchoRestorer
from tokentrail.trajectory.sample import Sample
from tokentrail.trajectory.side import conversation_tags, subagent_prompts
from tokentrail.trajectory.tree import Node, iter_nodes
from tokentrail.trajectory.turn import StoredTurn

if TYPE_CHECKING:
    from tokentrail import _core

__all__ = ["FATES", "SessionData", "Decode", "session_detail", "session_summary", "turn_detail"]

# Token fates in the order the page colours them; a token's fate is its index here.
FATES: tuple[str, ...] = ("trained", *(str(r) for r in MaskReason))
_TRAINED = 0
_FATE = {name: i for i, name in enumerate(FATES)}
# The order untrained tokens of one turn are given the ledger's reasons in (see `_fates`).
_REASON_ORDER = (
    MaskReason.TRUNCATED,
    MaskReason.REALIGNED,
    MaskReason.CONSTRAINED,
    MaskReason.EXCLUDED,
    MaskReason.MERGED_REWRITE,
    MaskReason.SUPERSEDED,
    MaskReason.UNACCOUNTED,
)
_SNIPPET = 120

# Token ids to the text of each (one string per id).
Decode = Callable[[Sequence[int]], list[str]]


@dataclass
class SessionData:
    """One session as the viewer reads it."""

    sid: str
    state: str
    root: Node
    store: _core.TurnStore
    trajectory: Trajectory
    # The session's echo restore: which harness messages were restored to which turn.
    echoes: EchoRestorer


def session_summary(data: SessionData) -> dict[str, Any]:
    """The sessions page's row: counts straight from the ledger."""
    ledger = data.trajectory.ledger
    return {
        "sid": data.sid,
        "state": data.state,
        "turns": len(ledger.turns),
        "samples": len(data.trajectory.samples),
        "generated": ledger.generated_tokens,
        "trained": ledger.trained_tokens,
        "masked": ledger.masked_tokens,
        "by_tool": ledger.by_tool,
        "restored_echoes": ledger.restored_echoes,
        "splice_fallbacks": ledger.splice_fallbacks,
    }


def sample_row(index: int, sample: Sample) -> dict[str, Any]:
    """One sample as the session page lists it."""
    return {
        "index": index,
        "turns": sample.metadata.get("turns", []),
        "tokens": len(sample.tokens),
        "response_length": sample.response_length,
        "trained": sample.trained_tokens,
        "truncated": bool(sample.metadata.get("truncated")),
        "conversation": sample.metadata.get("conversation"),
    }


def session_detail(data: SessionData) -> dict[str, Any]:
    """The session page: ledger, tree, samples and drifts (no tokens)."""
    traj = data.trajectory
    samples = [sample_row(i, s) for i, s in enumerate(traj.samples)]
    drifts = [
        {"turn_index": d.turn_index, "kind": str(d.kind), "at": d.at, "drifted": d.drifted}
        for d in traj.drifts
    ]
    return {
        **session_summary(data),
        "ledger": traj.ledger.to_dict(),
        "tree": tree_view(data.root, traj.ledger),
        "sample_list": samples,
        "drifts": drifts,
        "fates": list(FATES),
    }


# -- the tree ----------------------------------------------------------------------------------


def _snippet(message: Message | None) -> str:
    if message is None:
        return ""
    content = message.get("content")
    if isinstance(content, list):
        parts = [str(b.get("text") or b.get("type") or "") for b in content if isinstance(b, dict)]
        content = " ".join(parts)
    text = " ".join(str(content or "").split())
    calls = tool_names(message)
    if calls:
        text = f"{text} [{', '.join(calls)}]".strip()
    return text[:_SNIPPET] + ("…" if len(text) > _SNIPPET else "")


def _first_turn(node: Node) -> Node:
    """The first generated turn at or below `node` along first children (or the last node)."""
    while node.turn is None and node.children:
        node = node.children[0]
    return node


def branch_reason(
    root: Node, parent: Node, index: int, prompts: list[tuple[str, Node]]
) -> BranchReason:
    """Why `parent`'s child number `index` exists beside its elder siblings."""
    if index == 0:
        return BranchReason.MAIN
    child = parent.children[index]
    head = _first_turn(child)
    if head.metadata.get("excluded"):
        return BranchReason.EXCLUDED
    if child.turn is not None and any(c.turn is not None for c in parent.children[:index]):
        return BranchReason.RETRY
    if conversation_tags(root, head, prompts)["subagent"]:
        return BranchReason.SUBAGENT
    if parent is root:
        return BranchReason.NEW_CONVERSATION
    return BranchReason.REWRITTEN


def tree_view(root: Node, ledger: Ledger) -> list[dict[str, Any]]:
    """The tree cut down to what a reader follows: generated turns and branch points, each
    with its nearest shown ancestor as `parent`, the messages skipped on the way (`via`), and
    the reason of the branch it starts (`reason`, None when it continues its parent's line)."""
    rows = {t.turn_index: t for t in ledger.turns}
    prompts = subagent_prompts(iter_nodes(root))
    out: list[dict[str, Any]] = [{"id": 0, "parent": None, "kind": "root", "label": ""}]
    # (node, shown ancestor id, reason of the branch it opens, messages since that ancestor)
    stack: list[tuple[Node, int, BranchReason | None, int]] = [
        (c, 0, branch_reason(root, root, i, prompts) if len(root.children) > 1 else None, 0)
        for i, c in reversed(list(enumerate(root.children)))
    ]
    while stack:
        node, up, reason, via = stack.pop()
        kids = node.children
        branching = len(kids) > 1
        shown = up
        if node.turn is not None or branching or node.demoted:
            shown = len(out)
            row: dict[str, Any] = {
                "id": shown,
                "parent": up,
                "kind": "turn" if node.turn is not None else "branch",
                "role": node.role,
                "reason": None if reason is None else str(reason),
                "via": via,
                "label": _snippet(node.message),
            }
            if node.turn is not None and node.turn_index is not None:
                ledger_row = rows.get(node.turn_index)
                row["turn_index"] = node.turn_index
                row["tools"] = tool_names(node.message)
                if ledger_row is not None:
                    row.update(_turn_counts(ledger_row))
            if node.demoted:
                row["demoted"] = [d.turn_index for d in node.demoted]
            out.append(row)
            reason, via = None, 0
        else:
            via += 1
        for i in range(len(kids) - 1, -1, -1):
            child_reason = branch_reason(root, node, i, prompts) if branching else reason
            stack.append((kids[i], shown, child_reason, 0 if branching else via))
    return out


def _turn_counts(row: TurnLedger) -> dict[str, Any]:
    return {
        "generated": row.generated,
        "trained": row.trained,
        "masked": dict(row.masked),
        "history": row.history_label,
        "excluded": row.excluded,
        "superseded": row.superseded,
    }


# -- one turn's tokens -------------------------------------------------------------------------


def _find_turn(root: Node, turn_index: int) -> tuple[Node, StoredTurn, Message | None] | None:
    """The node holding generated turn `turn_index` (or the node a rewrite demoted it on),
    the turn, and its message."""
    for node in iter_nodes(root):
        if node.turn is not None and node.turn_index == turn_index:
            return node, node.turn, node.message
        for demoted in node.demoted:
            if demoted.turn_index == turn_index:
                return node, demoted.turn, demoted.message
    return None


def _fates(trajectory: Trajectory, row: TurnLedger, output_len: int) -> np.ndarray:
    """Each output token's fate: trained where a sample's loss mask trains it at the turn's
    placement; the others get the ledger's reasons, truncated first (the tokens no sample
    holds), then realigned and the whole-turn reasons, in `_REASON_ORDER`."""
    trained = np.zeros(output_len, dtype=bool)
    held = np.zeros(output_len, dtype=bool)
    for sample, placed in zip(trajectory.samples, trajectory.placements, strict=False):
        response_start = len(sample.tokens) - sample.response_length
        for p in placed:
            if p.turn_index != row.turn_index or p.end <= p.start:
                continue
            n = min(p.end - p.start, output_len)
            held[:n] = True
            lo = p.start - response_start
            if lo >= 0:
                trained[:n] |= sample.loss_mask[lo : lo + n].astype(bool)
    if row.excluded is not None:
        trained[:] = False
    fates = np.full(output_len, _FATE[MaskReason.UNACCOUNTED.value], dtype=np.uint8)
    fates[trained] = _TRAINED
    left = dict(row.masked)
    for reason in _REASON_ORDER:
        n = left.get(str(reason), 0)
        if not n:
            continue
        if reason is MaskReason.TRUNCATED:
            # Truncation cuts a sample's end: the last tokens no sample holds.
            candidates = np.flatnonzero(~trained & ~held)[::-1]
        else:
            candidates = np.flatnonzero(fates == _FATE[MaskReason.UNACCOUNTED.value])
            candidates = candidates[~trained[candidates]]
        take = candidates[:n]
        fates[take] = _FATE[str(reason)]
    return fates


def fate_counts(fates: np.ndarray) -> dict[str, int]:
    counted = np.bincount(fates, minlength=len(FATES))
    return {FATES[i]: int(n) for i, n in enumerate(counted) if n}


def _ledger_counts(row: TurnLedger) -> dict[str, int]:
    out = {"trained": row.trained} if row.trained else {}
    out.update({k: v for k, v in row.masked.items() if v})
    return out


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def turn_detail(
    data: SessionData, turn_index: int, decode: Decode | None, replay_names: Sequence[str]
) -> dict[str, Any] | None:
    """One turn's tokens: the prompt it added to the previous generated turn's tokens, its
    output with each token's fate, logprob, weight version and replay rows; the harness's
    echoes restored to it; and where a splice fallback's render departed from the tokens the
    previous turn saw. None when the session has no such turn."""
    found = _find_turn(data.root, turn_index)
    ledger_row = next((t for t in data.trajectory.ledger.turns if t.turn_index == turn_index), None)
    if found is None or ledger_row is None:
        return None
    node, turn, message = found
    store = data.store
    prompt = np.asarray(store.prompt_ids(turn.id))
    output = np.asarray(store.output_ids(turn.id))
    logprobs = store.logprobs(turn.id)
    previous = node.parent.generated_ancestor() if node.parent is not None else None
    before = (
        np.asarray(store.tokens(previous.turn.id))
        if previous is not None and previous.turn is not None
        else np.zeros(0, dtype=np.uint32)
    )
    shared = _common_prefix(before, prompt)
    fates = _fates(data.trajectory, ledger_row, len(output))
    versions = sorted({span.version for span in turn.weight_versions})
    version_of = np.full(len(output), -1, dtype=np.int32)
    for span in turn.weight_versions:
        version_of[span.start : span.end] = versions.index(span.version)
    replay: dict[str, list[int]] = {}
    for channel, read, shape in (
        ("routed_experts", store.routed_experts, store.routed_experts_shape),
        ("indexer_topk", store.indexer_topk, store.indexer_topk_shape),
    ):
        if shape is None:
            continue
        _rows, status = read(turn.id, len(prompt) + len(output))
        replay[channel] = np.asarray(status[len(prompt) :], dtype=np.int32).tolist()
    new_prompt = prompt[shared:]
    fallback = None
    if turn.fallback is not None:
        fallback = {
            "reason": str(turn.fallback),
            "at": shared,
            "previous": _token(before, shared, decode),
            "rendered": _token(prompt, shared, decode),
            "previous_length": len(before),
        }
    echoes = data.echoes.echoes_of(node) if node.turn is turn else []
    counts = fate_counts(fates)
    return {
        "turn_index": turn_index,
        "tools": tool_names(message),
        "finish_reason": turn.finish_reason,
        **_turn_counts(ledger_row),
        "prompt": {
            "length": len(prompt),
            "shared": shared,
            "previous_turn": None if previous is None else previous.turn_index,
            "ids": new_prompt.tolist(),
            "text": decode(new_prompt.tolist()) if decode else None,
        },
        "output": {
            "ids": output.tolist(),
            "text": decode(output.tolist()) if decode else None,
            "logprobs": None if logprobs is None else np.round(logprobs.astype(float), 4).tolist(),
            "fates": fates.tolist(),
            "versions": versions,
            "version": version_of.tolist(),
            "replay": replay,
        },
        "replay_status": list(replay_names),
        "fates": list(FATES),
        "fate_counts": counts,
        "ledger_counts": _ledger_counts(ledger_row),
        "consistent": counts == _ledger_counts(ledger_row),
        "message": message,
        "echoes": echoes,
        "fallback": fallback,
    }


def _token(ids: np.ndarray, at: int, decode: Decode | None) -> dict[str, Any] | None:
    if at >= len(ids):
        return None
    token = int(ids[at])
    return {"id": token, "text": decode([token])[0] if decode else None}
