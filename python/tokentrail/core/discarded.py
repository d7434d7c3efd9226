"""Tokens an engine sampled for a turn and then threw away itself: it aborted the request (vLLM's
`/pause?mode=abort` at a weight push), and the engine client generated the turn again. They are
recorded with the turn they were retried into (the ledger's `retried`, the journal), and never
trained: the harness never saw them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from tokentrail.core.routing import WeightSpan, WeightSpanJson

# The version of discarded tokens the engine named none for.
UNKNOWN_VERSION = "unknown"


class DiscardedJson(TypedDict):
    output_ids: list[int]
    logprobs: list[float]
    weight_versions: list[WeightSpanJson]


@dataclass(frozen=True)
class Discarded:
    """One aborted attempt at a turn: what it sampled until the engine stopped it, and which
    weights sampled which of those tokens (none: the engine did not say)."""

    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_versions: tuple[WeightSpan, ...] = ()

    @classmethod
    def of(
        cls, output_ids: Sequence[int], logprobs: Sequence[float], spans: Sequence[WeightSpan]
    ) -> Discarded:
        return cls(
            tuple(int(t) for t in output_ids), tuple(float(x) for x in logprobs), tuple(spans)
        )

    @property
    def tokens(self) -> int:
        return len(self.output_ids)

    def by_version(self) -> dict[str, int]:
        """Its tokens per weight version; those no span covers under `unknown`."""
        out: dict[str, int] = {}
        for span in self.weight_versions:
            out[span.version] = out.get(span.version, 0) + span.end - span.start
        covered = sum(out.values())
        if covered < self.tokens:
            out[UNKNOWN_VERSION] = out.get(UNKNOWN_VERSION, 0) + self.tokens - covered
        return out

    def to_dict(self) -> DiscardedJson:
        return {
            "output_ids": list(self.output_ids),
            "logprobs": list(self.logprobs),
            "weight_versions": [span.to_dict() for span in self.weight_versions],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Discarded:
        spans = [
            WeightSpan(str(s["version"]), int(s["start"]), int(s["end"]))
            for s in d.get("weight_versions") or ()
        ]
        return cls.of(d.get("output_ids") or (), d.get("logprobs") or (), spans)


def discarded_by_version(attempts: Sequence[Discarded]) -> dict[str, int]:
    """The tokens of `attempts` per weight version, summed."""
    out: dict[str, int] = {}
    for attempt in attempts:
        for version, n in attempt.by_version().items():
            out[version] = out.get(version, 0) + n
    return dict(sorted(out.items()))
