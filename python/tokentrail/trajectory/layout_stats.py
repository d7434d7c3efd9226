"""What the shared-prefix (tree) layout saves: tokens as rows against tokens as a tree.

One record shape for the ledger (per session), a packed tree (per group) and its sessions, so
the numbers a trainer gates on and the numbers `tokentrail pack` prints are the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict


class TreeStatsJson(TypedDict):
    rows: int
    row_tokens: int
    tree_tokens: int
    saved_tokens: int
    ratio: float


@dataclass(frozen=True)
class TreeStats:
    """`rows` samples holding `row_tokens` tokens between them, `tree_tokens` once merged at
    their shared prefixes (what a tree-attention forward pass computes)."""

    rows: int
    row_tokens: int
    tree_tokens: int

    @property
    def saved_tokens(self) -> int:
        return self.row_tokens - self.tree_tokens

    @property
    def ratio(self) -> float:
        """Row tokens per tree token (1.0: nothing shared)."""
        return self.row_tokens / self.tree_tokens if self.tree_tokens else 1.0

    def to_dict(self) -> TreeStatsJson:
        return {
            "rows": self.rows,
            "row_tokens": self.row_tokens,
            "tree_tokens": self.tree_tokens,
            "saved_tokens": self.saved_tokens,
            "ratio": round(self.ratio, 4),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TreeStats:
        return cls(int(d["rows"]), int(d["row_tokens"]), int(d["tree_tokens"]))
