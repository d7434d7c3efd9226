"""The token ledger: where every generated token went, and where that is decided.

For each generated turn: how many of its tokens some sample trains, and how many are masked,
by the named reason (`MaskReason`) that removed them. Trained plus masked equals generated, per
turn and in total, so a lost training signal is a number a trainer can see and gate on.
`build_ledger` assigns each token its fate from the tree and the linearization. Beside it: what
the model never saw (images and documents its prompts held as placeholders), how many sample
tokens carry their replay rows (routed experts, indexer top-k) and why the others do not
(`ReplayGap`), tokens per weight version, the attempts at a turn the engine aborted itself
and the engine client generated again (`retried`, their tokens `discarded`), the journaled
turns a crash or damage lost before linearization (`lost`, see `trajectory.lost`), and the
samples' tokens as rows against as one prefix tree (`layout`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from tokentrail.core.discarded import discarded_by_version
from tokentrail.core.ids import MaskArray
from tokentrail.kinds import (
    FALLBACK_PREFIX,
    Fallback,
    FinishReason,
    History,
    MaskReason,
    parse_kind,
)
from tokentrail.messages import tool_names
from tokentrail.trajectory.layout_stats import TreeStats, TreeStatsJson
from tokentrail.trajectory.lost import LostSpan, LostSpanJson, lost_events, lost_turns
from tokentrail.trajectory.tags import TurnTags
from tokentrail.trajectory.tree import Node

if TYPE_CHECKING:
    from tokentrail import _core

logger = logging.getLogger(__name__)


class TurnLedgerJson(TypedDict):
    turn_index: int
    tools: list[str]
    generated: int
    trained: int
    masked: dict[str, int]
    history: str | None
    fallback: str | None
    excluded: str | None
    dropped_media: dict[str, int]
    superseded: bool
    retries: int
    constrained: int
    length_truncated: bool
    weight_versions: list[str]
    retried: int
    discarded: dict[str, int]


class ReplayCoverageJson(TypedDict):
    tokens: int
    present: int
    missing: dict[str, int]
    coverage: float


class LedgerJson(TypedDict):
    """`Ledger.to_dict`: the ledger as `/finish` answers it and each sample's metadata holds."""

    generated_tokens: int
    trained_tokens: int
    masked_tokens: dict[str, int]
    excluded_turns: int
    constrained_tokens: int
    length_truncated_turns: int
    turns_across_updates: int
    turns_retried: int
    tokens_discarded: int
    dropped_media: dict[str, int]
    restored_echoes: int
    restored_by_tool: dict[str, int]
    restored_by_id: dict[str, dict[str, int]]
    turns: list[TurnLedgerJson]
    by_tool: dict[str, dict[str, int]]
    splice_fallbacks: dict[str, int]
    replay: dict[str, ReplayCoverageJson]
    weight_versions: dict[str, dict[str, int]]
    retries: int
    layout: TreeStatsJson | None
    lost_turns: int
    lost_events: int
    lost: list[LostSpanJson]


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
    # Why the turn is excluded from training (a side conversation), if it is.
    excluded: str | None = None
    # Images/documents the turn's prompt held as placeholders, by kind.
    dropped_media: dict[str, int] = field(default_factory=dict)
    # A later generation from the same prompt replaced it (see `MaskReason.SUPERSEDED`).
    superseded: bool = False
    # Retried requests answered with this turn's recorded reply instead of a new generation.
    retries: int = 0
    # Output tokens sampled under a structured-output grammar (a forced tool call): all of
    # the turn's when it was, trained or masked `constrained` as the policy says.
    constrained: int = 0
    # The turn was cut by its `max_tokens` (finish reason `length`).
    length_truncated: bool = False
    # The weight versions that sampled the turn, in order: more than one when the weights
    # were updated while it was sampled (`/pause?mode=keep`, a reload, `/resume`).
    weight_versions: list[str] = field(default_factory=list)
    # Attempts at the turn the engine aborted itself (a weight push's `/pause?mode=abort`),
    # each generated again by the engine client, and the tokens they had sampled by weight
    # version: recorded, never trained, and not in `generated` (the harness never saw them).
    retried: int = 0
    discarded: dict[str, int] = field(default_factory=dict)

    @property
    def masked_total(self) -> int:
        return sum(self.masked.values())

    @property
    def history_label(self) -> str | None:
        """The ledger JSON's `history`: "splice", "render" or "splice_fallback:<reason>"."""
        if self.fallback is not None:
            return self.fallback.label
        return None if self.history is None else self.history.value

    def to_dict(self) -> TurnLedgerJson:
        return {
            "turn_index": self.turn_index,
            "tools": list(self.tools),
            "generated": self.generated,
            "trained": self.trained,
            "masked": dict(self.masked),
            "history": self.history_label,
            "fallback": None if self.fallback is None else self.fallback.value,
            "excluded": self.excluded,
            "dropped_media": dict(self.dropped_media),
            "superseded": self.superseded,
            "retries": self.retries,
            "constrained": self.constrained,
            "length_truncated": self.length_truncated,
            "weight_versions": list(self.weight_versions),
            "retried": self.retried,
            "discarded": dict(self.discarded),
        }


def parse_history_label(label: object) -> tuple[History | None, Fallback | None]:
    """The two fields behind a ledger JSON `history` label (older files carry only it)."""
    if not isinstance(label, str):
        return None, None
    if label.startswith(FALLBACK_PREFIX):
        return History.RENDER, parse_kind(Fallback, label.removeprefix(FALLBACK_PREFIX), "fallback")
    return parse_kind(History, label, "history mode"), None


@dataclass
class ReplayCoverage:
    """Of the sample tokens a trainer feeds forward, how many carry their replay row, and why
    the others carry none. Each sample's last token is left out: nothing is computed from it,
    so no engine reports it (its row is zeros, as slime's trainer pads it)."""

    tokens: int = 0
    present: int = 0
    missing: dict[str, int] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.present == self.tokens

    @property
    def fraction(self) -> float:
        return self.present / self.tokens if self.tokens else 1.0

    @classmethod
    def of(cls, status: MaskArray, names: Sequence[str]) -> ReplayCoverage:
        """The coverage of one sample, from its per-token status codes (`REPLAY_STATUS`)."""
        counted = np.bincount(status[: max(0, len(status) - 1)], minlength=len(names))
        missing = {names[code]: int(n) for code, n in enumerate(counted) if code > 1 and n}
        return cls(int(counted.sum()), int(counted[0]), missing)

    def add(self, other: ReplayCoverage) -> None:
        self.tokens += other.tokens
        self.present += other.present
        for reason, n in other.missing.items():
            self.missing[reason] = self.missing.get(reason, 0) + n

    def to_dict(self) -> ReplayCoverageJson:
        return {
            "tokens": self.tokens,
            "present": self.present,
            "missing": dict(sorted(self.missing.items())),
            "coverage": round(self.fraction, 6),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReplayCoverage:
        missing = {str(k): int(v) for k, v in (d.get("missing") or {}).items()}
        return cls(int(d.get("tokens", 0)), int(d.get("present", 0)), missing)


@dataclass
class Ledger:
    turns: list[TurnLedger] = field(default_factory=list)
    # Generated messages restored from a harness's echo (each once, with or without calls).
    restored_echoes: int = 0
    # The tool calls in those messages, by tool name: another unit than `restored_echoes`
    # (a restored message with two calls adds 2 here and 1 there; one with none, 0 here).
    restored_by_tool: dict[str, int] = field(default_factory=dict)
    # Of those, the calls restored by identity only (the ids we minted, the same tools, what
    # the coarse comparison did not recognize), by tool name and what the harness changed
    # (`EchoDifference`): {"Bash": {"arguments": 3}}.
    restored_by_id: dict[str, dict[str, int]] = field(default_factory=dict)
    # Per replay channel kept ("routed_experts", "indexer_topk"): the samples' coverage.
    replay: dict[str, ReplayCoverage] = field(default_factory=dict)
    # Per weight version: output tokens it sampled ("generated") and of those, trained.
    weight_versions: dict[str, dict[str, int]] = field(default_factory=dict)
    # Journaled events of the session that were not recovered (a crash, a damaged journal):
    # turns in none of the rows above, whose tokens no count here includes.
    lost: list[LostSpan] = field(default_factory=list)
    # The samples' tokens as rows against as one prefix tree (`trajectory.prefix_tree`).
    layout: TreeStats | None = None

    @property
    def lost_turns(self) -> int:
        """Generated turns lost before linearization (-1: an unknown number)."""
        return lost_turns(self.lost)

    @property
    def lost_events(self) -> int:
        """Journaled events lost before linearization (-1: an unknown number)."""
        return lost_events(self.lost)

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
    def dropped_media(self) -> dict[str, int]:
        """Media placeholders in the prompts, by kind, summed over turns (an image a harness
        resends every turn counts once per turn whose prompt lacked it)."""
        out: dict[str, int] = {}
        for t in self.turns:
            for kind, n in t.dropped_media.items():
                out[kind] = out.get(kind, 0) + n
        return dict(sorted(out.items()))

    @property
    def excluded_turns(self) -> int:
        return sum(1 for t in self.turns if t.excluded is not None)

    @property
    def retries(self) -> int:
        """Retried requests answered from the record, all turns together."""
        return sum(t.retries for t in self.turns)

    @property
    def constrained_tokens(self) -> int:
        """Generated tokens sampled under a grammar, trained or not."""
        return sum(t.constrained for t in self.turns)

    @property
    def length_truncated_turns(self) -> int:
        """Turns cut by their `max_tokens`."""
        return sum(1 for t in self.turns if t.length_truncated)

    @property
    def turns_across_updates(self) -> int:
        """Turns sampled under more than one weight version: the weights were updated while
        they were sampled, and each token says which sampled it."""
        return sum(1 for t in self.turns if len(t.weight_versions) > 1)

    @property
    def turns_retried(self) -> int:
        """Turns the engine aborted (a weight push's `/pause?mode=abort`) and the engine
        client generated again."""
        return sum(1 for t in self.turns if t.retried)

    @property
    def tokens_discarded(self) -> int:
        """Tokens the aborted attempts had sampled: on top of `generated_tokens`, never
        trained."""
        return sum(sum(t.discarded.values()) for t in self.turns)

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
                    excluded=t.get("excluded"),
                    dropped_media={k: int(v) for k, v in (t.get("dropped_media") or {}).items()},
                    superseded=bool(t.get("superseded", False)),
                    retries=int(t.get("retries", 0)),
                    constrained=int(t.get("constrained", 0)),
                    length_truncated=bool(t.get("length_truncated", False)),
                    weight_versions=[str(v) for v in t.get("weight_versions") or ()],
                    retried=int(t.get("retried", 0)),
                    discarded={str(k): int(n) for k, n in (t.get("discarded") or {}).items()},
                )
            )
        return cls(
            turns=turns,
            restored_echoes=int(d.get("restored_echoes", 0)),
            restored_by_tool=dict(d.get("restored_by_tool") or {}),
            restored_by_id={
                str(tool): {str(k): int(n) for k, n in kinds.items()}
                for tool, kinds in (d.get("restored_by_id") or {}).items()
            },
            replay={
                str(k): ReplayCoverage.from_dict(v) for k, v in (d.get("replay") or {}).items()
            },
            weight_versions={
                str(k): {"generated": int(v["generated"]), "trained": int(v["trained"])}
                for k, v in (d.get("weight_versions") or {}).items()
            },
            layout=TreeStats.from_dict(d["layout"]) if d.get("layout") else None,
            lost=[LostSpan.from_dict(x) for x in d.get("lost") or ()],
        )

    def to_dict(self) -> LedgerJson:
        """The ledger as JSON. `restored_echoes` counts restored messages, `restored_by_tool`
        the tool calls in them by name (two units: see the fields)."""
        return {
            "generated_tokens": self.generated_tokens,
            "trained_tokens": self.trained_tokens,
            "masked_tokens": self.masked_tokens,
            "excluded_turns": self.excluded_turns,
            "constrained_tokens": self.constrained_tokens,
            "length_truncated_turns": self.length_truncated_turns,
            "turns_across_updates": self.turns_across_updates,
            "turns_retried": self.turns_retried,
            "tokens_discarded": self.tokens_discarded,
            "dropped_media": self.dropped_media,
            "restored_echoes": self.restored_echoes,
            "restored_by_tool": dict(sorted(self.restored_by_tool.items())),
            "restored_by_id": {
                tool: dict(sorted(kinds.items()))
                for tool, kinds in sorted(self.restored_by_id.items())
            },
            "turns": [t.to_dict() for t in self.turns],
            "by_tool": self.by_tool,
            "splice_fallbacks": self.splice_fallbacks,
            "replay": {k: v.to_dict() for k, v in self.replay.items()},
            "weight_versions": dict(sorted(self.weight_versions.items())),
            "retries": self.retries,
            "layout": self.layout.to_dict() if self.layout is not None else None,
            "lost_turns": self.lost_turns,
            "lost_events": self.lost_events,
            "lost": [span.to_dict() for span in self.lost],
        }


# -- deciding every generated token's fate ---------------------------------------------------


def is_superseded(node: Node) -> bool:
    """A generated turn a later generation from its prompt replaced, and nothing built on."""
    return node.turn is not None and node.turn.superseded and not node.children


def build_ledger(
    nodes: Sequence[Node],
    lin: _core.Linearized,
    *,
    restored_echoes: int,
    restored_by_tool: Mapping[str, int],
    restored_by_id: Mapping[str, Mapping[str, int]] | None = None,
    samples: Sequence[Mapping[str, Any]] = (),
    replays: Sequence[str] = (),
    mask_superseded: bool = True,
    constrained_masked: Mapping[int, int] | None = None,
    turn_tags: Mapping[int, TurnTags] | None = None,
    turn_tools: Mapping[int, Sequence[str]] | None = None,
) -> Ledger:
    """Every generated turn of a session's tree (`nodes`, the tree walked once by the caller;
    `turn_tags`, each generated turn's tags by store id when the caller read them already;
    `turn_tools` likewise, the names of its message's tool calls),
    with its tokens trained or masked.

    A turn still in the tree is trained where a sample trains it and masked where linearization
    realigned or truncated it; an excluded turn (in no sample) is masked whole as `excluded`; a
    turn a rewrite demoted is masked whole as `merged_rewrite`; a superseded turn, left out of
    linearization (unless `mask_superseded` is off), is masked whole as `superseded`. From the
    samples' metadata: the coverage of each replay channel kept (`replays`) and the trained
    tokens per weight version; the tokens each version generated come from every turn.
    `constrained_masked`: the trained tokens the constrained policy took out, by store id
    (masked `constrained`).
    """
    constrained_masked = constrained_masked or {}
    rows: list[TurnLedger] = []
    coverage = {str(channel): ReplayCoverage() for channel in replays}
    trained: dict[str, int] = {}
    for metadata in samples:
        for channel, cov in coverage.items():
            cov.add(ReplayCoverage.from_dict(metadata["replay"][channel]))
        for span in metadata.get("weight_versions", ()):
            trained[span["version"]] = trained.get(span["version"], 0) + span["trained"]
    generated = generated_by_version(nodes)
    versions = {
        v: {"generated": generated.get(v, 0), "trained": trained.get(v, 0)}
        for v in sorted({*generated, *trained})
    }
    lin_trained, lin_realigned, lin_truncated = lin.trained, lin.realigned, lin.truncated
    for node in nodes:
        turn = node.turn
        if turn is not None:
            k = turn.id
            tags = turn_tags[k] if turn_tags is not None else TurnTags.read(node.metadata)
            excluded = tags.excluded
            disconnected = tags.client_disconnected
            superseded = is_superseded(node)
            constrained = constrained_masked.get(k, 0)
            trained_k = 0 if excluded or disconnected else lin_trained.get(k, 0) - constrained
            masked: dict[MaskReason, int]
            if excluded:
                masked = {MaskReason.EXCLUDED: turn.output_len}
            elif disconnected:
                masked = {MaskReason.CLIENT_DISCONNECTED: turn.output_len}
            else:
                masked = {
                    MaskReason.REALIGNED: lin_realigned.get(k, 0),
                    MaskReason.TRUNCATED: lin_truncated.get(k, 0),
                    MaskReason.CONSTRAINED: constrained,
                }
            if superseded and mask_superseded and not excluded and not disconnected:
                # Left out of every sample: whatever no other reason took.
                masked[MaskReason.SUPERSEDED] = turn.output_len - trained_k - sum(masked.values())
            names = list(turn_tools[k]) if turn_tools is not None else tool_names(node.message)
            row = turn_fate(node.turn_index or 0, names, turn.output_len, trained_k, masked)
            row.history, row.fallback = turn.history, turn.fallback
            row.excluded = str(excluded) if excluded else None
            row.dropped_media = dict(tags.dropped_media)
            row.superseded, row.retries = superseded, turn.retries
            row.constrained = turn.output_len if tags.constrained else 0
            row.length_truncated = turn.finish_reason == FinishReason.LENGTH
            row.weight_versions = [span.version for span in turn.weight_versions]
            if turn.discarded:
                row.retried, row.discarded = (
                    len(turn.discarded),
                    discarded_by_version(turn.discarded),
                )
            rows.append(row)
        for demoted in node.demoted:
            row = turn_fate(
                demoted.turn_index,
                tool_names(demoted.message),
                demoted.turn.output_len,
                0,
                {MaskReason.MERGED_REWRITE: demoted.turn.output_len},
            )
            demoted_tags = TurnTags.read(demoted.metadata)
            row.dropped_media = dict(demoted_tags.dropped_media)
            row.constrained = demoted.turn.output_len if demoted_tags.constrained else 0
            row.length_truncated = demoted.turn.finish_reason == FinishReason.LENGTH
            row.weight_versions = [span.version for span in demoted.turn.weight_versions]
            row.retried = len(demoted.turn.discarded)
            row.discarded = discarded_by_version(demoted.turn.discarded)
            rows.append(row)
    rows.sort(key=lambda r: r.turn_index)
    return Ledger(
        turns=rows,
        restored_echoes=restored_echoes,
        restored_by_tool=dict(restored_by_tool),
        restored_by_id={t: dict(k) for t, k in (restored_by_id or {}).items()},
        replay=coverage,
        weight_versions=versions,
    )


def generated_by_version(nodes: Iterable[Node]) -> dict[str, int]:
    """Output tokens per weight version over every generated turn of `nodes`, demoted ones
    included."""
    counts: dict[str, int] = {}
    for node in nodes:
        turns = [d.turn for d in node.demoted]
        if node.turn is not None:
            turns.append(node.turn)
        for turn in turns:
            for span in turn.weight_versions:
                counts[span.version] = counts.get(span.version, 0) + span.end - span.start
    return counts


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
