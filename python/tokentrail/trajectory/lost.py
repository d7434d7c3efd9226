"""What a session lost before it was linearized: journaled events a crash or damage took.

A `LostSpan` is one run of a session's journaled events that did not come back (from which
event on, how many events, how many of them were generated turns, and why); a session's spans
travel with it into its ledger, its samples' metadata and its finish answer, so a session that
lost turns never reads as one that generated nothing. A count of -1 is unknown (the receipts
that would name the lost events are gone too): at least one event was lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

UNKNOWN = -1


class LostSpanJson(TypedDict):
    first: int
    events: int
    turns: int
    reason: str


class LostJson(TypedDict):
    """`summary`: the loss in a finish answer and each sample's metadata."""

    turns: int
    events: int
    spans: list[LostSpanJson]


@dataclass(frozen=True)
class LostSpan:
    """Events of one session from #`first` on that were not recovered."""

    first: int  # the session sequence number of the first event lost
    events: int  # how many (-1: unknown)
    turns: int  # how many of them were generated turns (-1: unknown)
    reason: str

    def to_dict(self) -> LostSpanJson:
        return {
            "first": self.first,
            "events": self.events,
            "turns": self.turns,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LostSpan:
        """A span from its dict, or from a journal's `lost` event (older ones lack `turns`)."""
        return cls(
            first=int(d.get("first", 0)),
            events=int(d.get("events", UNKNOWN)),
            turns=int(d.get("turns", UNKNOWN)),
            reason=str(d.get("reason", "")),
        )


def total(counts: Iterable[int]) -> int:
    """A sum of counts of which any may be unknown (-1): then the total is unknown too."""
    out = 0
    for n in counts:
        if n < 0:
            return UNKNOWN
        out += n
    return out


def lost_turns(spans: Sequence[LostSpan]) -> int:
    return total(s.turns for s in spans)


def lost_events(spans: Sequence[LostSpan]) -> int:
    return total(s.events for s in spans)


def summary(spans: Sequence[LostSpan]) -> LostJson | None:
    """What a finish answer and each sample's metadata say of the loss (None: nothing lost)."""
    if not spans:
        return None
    return {
        "turns": lost_turns(spans),
        "events": lost_events(spans),
        "spans": [s.to_dict() for s in spans],
    }


def describe(sid: str, spans: Sequence[LostSpan]) -> str:
    """One line naming what the session lost."""

    def count(n: int) -> str:
        return "an unknown number of" if n < 0 else str(n)

    parts = [
        f"{count(s.turns)} turns ({count(s.events)} events) from event #{s.first} on: {s.reason}"
        for s in spans
    ]
    return f"session {sid!r} lost journaled turns before it was finished: " + "; ".join(parts)


__all__ = [
    "UNKNOWN",
    "LostJson",
    "LostSpan",
    "LostSpanJson",
    "describe",
    "lost_events",
    "lost_turns",
    "summary",
    "total",
]
