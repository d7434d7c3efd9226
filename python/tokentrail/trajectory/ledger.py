"""The token ledger: where every generated token went, and where that is decided.

For each generated turn: how many of its tokens some sample trains, and how many are masked,
by the named reason (`MaskReason`) that removed them. Trained plus masked equals generated, per
turn and in total, so a lost training signal is a number a trainer can see and gate on.
`build_ledger` assigns each token its fate from the tree and the linearization.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokentrail.core.backend import LinearizedLike
from tokentrail.kinds import FALLBACK_PREFIX, Fallback, History, MaskReason
from tokentrail.messages import tool_names
from tokentrail.trajectory.tree import Node, iter_nodes

logger = logging.getLogger(__name__)


@dataclass
class TurnLedger:
    turn_index: int
    tools: list[str]
    generated: int
    trained: int
    masked: dict[str, int] = field(default_factory=dict)
    # How the turn's prompt ids were built, and why a splice fell back to a render.
    history: History | None = None
    fallback: Fallback | None = None
    # A later generation from the same prompt replaced it (see `MaskReason.SUPERSEDED`).
    superseded: bool = False
    # Retried requests answered with this turn's recorded reply instead of a new generation.
    replays: int = 0

    @property
    def masked_total(self) -> int:
        return sum(self.masked.values())

    @property
    def history_label(self) -> str | None:
        """The ledger JSON's `history`: "splice", "render" or "splice_fallback:<reason>"."""
        if self.fallback is not None:
            return self.fallback.label
        return None if self.history is None else self.history.value

    def to_dict(self) -> dict[str, Any]:
        return {
            "turn_index": self.turn_index,
            "tools": list(self.tools),
            "generated": self.generated,
            "trained": self.trained,
            "masked": dict(self.masked),
            "history": self.history_label,
            "fallback": None if self.fallback is None else self.fallback.value,
            "superseded": self.superseded,
            "replays": self.replays,
        }


def parse_history_label(label: object) -> tuple[History | None, Fallback | None]:
    """The two fields behind a ledger JSON `history` label (older files carry only it)."""
    if not isinstance(label, str):
        return None, None
    if label.startswith(FALLBACK_PREFIX):
        return History.RENDER, Fallback(label.removeprefix(FALLBACK_PREFIX))
    return History(label), None


@dataclass
class Ledger:
    turns: list[TurnLedger] = field(default_factory=list)
    restored_echoes: int = 0
    restored_by_tool: dict[str, int] = field(default_factory=dict)

    @property
    def generated_tokens(self) -> int:
        return sum(t.generated for t in self.turns)

    @property
    def trained_tokens(self) -> int:
        return sum(t.trained for t in self.turns)

    @property
    def masked_tokens(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.turns:
            for reason, n in t.masked.items():
                out[reason] = out.get(reason, 0) + n
        return dict(sorted(out.items()))

    @property
    def replays(self) -> int:
        """Retried requests answered from the record, all turns together."""
        return sum(t.replays for t in self.turns)

    @property
    def splice_fallbacks(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.turns:
            if t.fallback is not None:
                out[t.fallback.value] = out.get(t.fallback.value, 0) + 1
        return dict(sorted(out.items()))

    @property
    def by_tool(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for t in self.turns:
            for tool in dict.fromkeys(t.tools):
                row = out.setdefault(
                    tool, {"turns": 0, "turns_trained": 0, "tokens_trained": 0, "tokens_masked": 0}
                )
                row["turns"] += 1
                row["turns_trained"] += t.trained > 0
                row["tokens_trained"] += t.trained
                row["tokens_masked"] += t.masked_total
        return dict(sorted(out.items()))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Ledger:
        """The ledger of a `to_dict()` (as `/finish` answers it)."""
        turns = []
        for t in d.get("turns", []):
            history, fallback = parse_history_label(t.get("history"))
            turns.append(
                TurnLedger(
                    turn_index=int(t["turn_index"]),
                    tools=list(t.get("tools") or []),
                    generated=int(t["generated"]),
                    trained=int(t["trained"]),
                    masked={k: int(v) for k, v in (t.get("masked") or {}).items()},
                    history=history,
                    fallback=fallback,
                    superseded=bool(t.get("superseded", False)),
                    replays=int(t.get("replays", 0)),
                )
            )
        return cls(
            turns=turns,
            restored_echoes=int(d.get("restored_echoes", 0)),
            restored_by_tool=dict(d.get("restored_by_tool") or {}),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "generated_tokens": self.generated_tokens,
            "trained_tokens": self.trained_tokens,
            "masked_tokens": self.masked_tokens,
            "restored_echoes": self.restored_echoes,
            "restored_by_tool": dict(sorted(self.restored_by_tool.items())),
            "turns": [t.to_dict() for t in self.turns],
            "by_tool": self.by_tool,
            "splice_fallbacks": self.splice_fallbacks,
            "replays": self.replays,
        }


# -- deciding every generated token's fate ---------------------------------------------------


def is_superseded(node: Node) -> bool:
    """A generated turn a later generation from its prompt replaced, and nothing built on."""
    return node.turn is not None and node.turn.superseded and not node.children


def build_ledger(
    root: Node,
    lin: LinearizedLike,
    *,
    restored_echoes: int,
    restored_by_tool: Mapping[str, int],
    mask_superseded: bool = True,
) -> Ledger:
    """Every generated turn of a session's tree, with its tokens trained or masked.

    A turn still in the tree is trained where a sample trains it and masked where linearization
    realigned or truncated it; a turn a rewrite demoted is masked whole as `merged_rewrite`; a
    superseded turn, left out of linearization, is masked whole as `superseded`.
    """
    rows: list[TurnLedger] = []
    for node in iter_nodes(root):
        turn = node.turn
        if turn is not None:
            k = turn.id
            superseded = is_superseded(node)
            masked = {
                MaskReason.REALIGNED: lin.realigned.get(k, 0),
                MaskReason.TRUNCATED: lin.truncated.get(k, 0),
            }
            if superseded and mask_superseded:
                # Left out of every sample: whatever no other reason took.
                taken = lin.trained.get(k, 0) + sum(masked.values())
                masked[MaskReason.SUPERSEDED] = turn.output_len - taken
            row = turn_fate(
                node.turn_index or 0,
                tool_names(node.message),
                turn.output_len,
                lin.trained.get(k, 0),
                masked,
            )
            row.history, row.fallback = turn.history, turn.fallback
            row.superseded, row.replays = superseded, turn.replays
            rows.append(row)
        for demoted in node.demoted:
            rows.append(
                turn_fate(
                    demoted.turn_index,
                    tool_names(demoted.message),
                    demoted.turn.output_len,
                    0,
                    {MaskReason.MERGED_REWRITE: demoted.turn.output_len},
                )
            )
    rows.sort(key=lambda r: r.turn_index)
    return Ledger(
        turns=rows, restored_echoes=restored_echoes, restored_by_tool=dict(restored_by_tool)
    )


def turn_fate(
    turn_index: int,
    tools: list[str],
    generated: int,
    trained: int,
    masked: Mapping[MaskReason, int],
) -> TurnLedger:
    """One turn's row; a token no reason accounts for is logged and counted as `unaccounted`."""
    kept = {str(reason): n for reason, n in masked.items() if n}
    gap = generated - trained - sum(kept.values())
    if gap:
        logger.error("turn %d: %d generated tokens are not accounted for", turn_index, gap)
        kept[MaskReason.UNACCOUNTED.value] = gap
    return TurnLedger(turn_index, tools, generated, trained, kept)
