"""The token ledger: where every generated token went.

For each generated turn: how many of its tokens some sample trains, and how many are masked,
by the named reason that removed them. Trained plus masked equals generated, per turn and in
total, so a lost training signal is a number a trainer can see and gate on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Reasons a generated token is masked.
REALIGNED = "realigned"
MERGED_REWRITE = "merged_rewrite"
TRUNCATED = "truncated"
# Never expected: a token no reason accounts for. Logged as an error when it happens.
UNACCOUNTED = "unaccounted"


@dataclass
class TurnLedger:
    turn_index: int
    tools: list[str]
    generated: int
    trained: int
    masked: dict[str, int] = field(default_factory=dict)
    # How the turn's prompt ids were built: "splice", "render", "splice_fallback:<reason>".
    history: str | None = None

    @property
    def masked_total(self) -> int:
        return sum(self.masked.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "turn_index": self.turn_index,
            "tools": list(self.tools),
            "generated": self.generated,
            "trained": self.trained,
            "masked": dict(self.masked),
            "history": self.history,
        }


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
    def splice_fallbacks(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.turns:
            if t.history and t.history.startswith("splice_fallback:"):
                reason = t.history.split(":", 1)[1]
                out[reason] = out.get(reason, 0) + 1
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
    def from_dict(cls, d: dict[str, Any]) -> Ledger:
        """The ledger of a `to_dict()` (as `/finish` answers it)."""
        turns = [
            TurnLedger(
                turn_index=int(t["turn_index"]),
                tools=list(t.get("tools") or []),
                generated=int(t["generated"]),
                trained=int(t["trained"]),
                masked={k: int(v) for k, v in (t.get("masked") or {}).items()},
                history=t.get("history"),
            )
            for t in d.get("turns", [])
        ]
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
        }
