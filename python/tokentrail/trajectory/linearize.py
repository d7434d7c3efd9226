"""Linearization: a finished session's tree into training samples, its ledger and the drift
decisions taken on the way (the chains of generated turns go through the core backend's store).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tokentrail.errors import TreeError
from tokentrail.kinds import (
    ConstrainedPolicy,
    DriftKind,
    DriftPolicy,
    FinishReason,
    Replay,
    parse_kind,
)
from tokentrail.messages import tool_names
from tokentrail.trajectory.ledger import Ledger, build_ledger, is_superseded
from tokentrail.trajectory.lost import LostJson, LostSpan
from tokentrail.trajectory.lost import summary as lost_summary
from tokentrail.trajectory.prefix_tree import tree_stats
from tokentrail.trajectory.sample import (
    RowRead,
    Sample,
    replay_rows,
    store_rows,
    trained_versions,
)
from tokentrail.trajectory.side import SUBAGENT_TOOLS, conversation_tags, subagent_prompts
from tokentrail.trajectory.tags import TurnTags
from tokentrail.trajectory.tree import Node, marked_and_leaves
from tokentrail.trajectory.turn import StoredTurn

if TYPE_CHECKING:
    from tokentrail import _core

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriftRecord:
    """One drift decision taken while linearizing: at which turn, of what kind, how big."""

    turn_index: int
    kind: DriftKind
    at: int
    drifted: int


@dataclass(frozen=True)
class Placement:
    """Where a turn's output sits in a sample: output token 0 at `tokens[start]`, up to
    `tokens[end]` (less than the whole output when the sample was cut short)."""

    turn_index: int
    start: int
    end: int


@dataclass
class Trajectory:
    samples: list[Sample]
    ledger: Ledger
    drifts: list[DriftRecord] = field(default_factory=list)
    # Per sample, where each of its turns' outputs sits in it (a viewer colours tokens by it).
    placements: list[list[Placement]] = field(default_factory=list)

    @property
    def drift_counts(self) -> dict[str, int]:
        return dict(Counter(str(d.kind) for d in self.drifts))

    @property
    def lost(self) -> LostJson | None:
        """What the session lost before linearization (see `trajectory.lost`), or None."""
        return lost_summary(self.ledger.lost)

    def mark_lost(self, spans: Sequence[LostSpan]) -> None:
        """Record, in the ledger and in every sample's metadata, the journaled turns the
        session lost before it was linearized (none: nothing changes)."""
        if not spans:
            return
        self.ledger.lost = [*self.ledger.lost, *spans]
        for sample in self.samples:
            sample.metadata["lost"] = self.lost


def linearize_session(
    sid: str,
    root: Node,
    store: _core.TurnStore,
    *,
    policy: DriftPolicy,
    fork_threshold: int,
    max_sample_tokens: int,
    reward: float,
    extra_metadata: dict[str, Any] | None,
    restored: int,
    restored_by_tool: Mapping[str, int],
    replays: tuple[Replay, ...],
    status: Sequence[str],
    read_rows: RowRead | None = None,
    train_superseded: bool = False,
    train_constrained: ConstrainedPolicy = ConstrainedPolicy.MASK,
    restored_by_id: Mapping[str, Mapping[str, int]] | None = None,
    known_tags: Mapping[int, tuple[Mapping[str, Any], TurnTags]] | None = None,
    known_tools: Mapping[int, tuple[object, tuple[str, ...]]] | None = None,
) -> Trajectory:
    """Every sample of the session's chains, the ledger of every generated token, the drifts.

    `read_rows` reads the samples' replay rows (default: from `store`'s tapes).
    Tokens of a turn sampled under a grammar are marked in their sample's metadata
    (`constrained`) and, under `ConstrainedPolicy.MASK`, masked as `constrained`.
    `known_tags`: generated turns' tags read already (by store id), each with the metadata it
    was read from; a turn whose metadata is another object is read again. `known_tools`
    likewise: the names of each generated message's tool calls, with that message."""
    # The tree walked once: its leaves, and the nodes that hold a generated turn or a demoted
    # one (what the ledger reads), each generated turn's tags read once.
    marked, leaves = marked_and_leaves(root)
    # Store ids are turn indices - 1: a turn is pushed when it is recorded.
    generated: dict[int, Node] = {n.turn.id: n for n in marked if n.turn is not None}
    known_tags, known_tools = known_tags or {}, known_tools or {}
    tags: dict[int, TurnTags] = {}
    tools: dict[int, tuple[str, ...]] = {}
    for k, n in generated.items():
        known = known_tags.get(k)
        tags[k] = known[1] if known and known[0] is n.metadata else TurnTags.read(n.metadata)
        message = n.message
        named = known_tools.get(k)
        tools[k] = named[1] if named and named[0] is message else tuple(tool_names(message))
    lin = store.linearize(
        _chains(leaves, tags, train_superseded),
        policy=policy.value,
        fork_threshold=fork_threshold,
        max_sample_tokens=max_sample_tokens,
    )
    # Only a turn that called a sub-agent tool can have handed one a prompt.
    prompts = subagent_prompts(
        n for k, n in generated.items() if not SUBAGENT_TOOLS.isdisjoint(tools[k])
    )
    # Trained tokens the constrained policy masked, by store id.
    constrained_masked: dict[int, int] = {}
    samples = [
        _sample(sid, built, generated, tags, tools, reward, extra_metadata, root, prompts)
        for built in lin.samples
    ]
    for sample, built in zip(samples, lin.samples, strict=True):
        mark_constrained(sample, built, tags, train_constrained, constrained_masked)
        versions = trained_versions(built, sample.loss_mask, [generated[t] for t in built.turns])
        if versions:
            sample.metadata["weight_versions"] = versions
        sample.metadata.update(extra_metadata or {})
        replay_rows(sample, built, read_rows or store_rows(store), replays, status)
    ledger = build_ledger(
        marked,
        lin,
        turn_tags=tags,
        turn_tools=tools,
        restored_echoes=restored,
        restored_by_tool=restored_by_tool,
        restored_by_id=restored_by_id or {},
        samples=[s.metadata for s in samples],
        replays=replays,
        mask_superseded=not train_superseded,
        constrained_masked=constrained_masked,
    )
    try:
        ledger.layout = tree_stats(samples)
    except TreeError as exc:  # replay rows of mixed shapes: the samples still train as rows
        logger.debug("session %s: no tree layout stats: %s", sid, exc)
    found = lin.drifts
    kinds = {kind: parse_kind(DriftKind, kind, "drift kind") for kind in {d.kind for d in found}}
    drifts = [
        DriftRecord(generated[d.turn].turn_index or 0, kinds[d.kind], d.at, d.drifted)
        for d in found
    ]
    placements = [
        [
            Placement(generated[span.turn].turn_index or 0, span.start, span.end)
            for span in built.spans
            if span.turn in generated
        ]
        for built in lin.samples
    ]
    return Trajectory(samples, ledger, drifts, placements)


def mark_constrained(
    sample: Sample,
    built: _core.BuiltSample,
    tags: Mapping[int, TurnTags],
    policy: ConstrainedPolicy,
    masked: dict[int, int],
) -> None:
    """Mark the stretches of `sample`'s response sampled under a grammar (its turns tagged
    `constrained`) in `metadata["constrained"]`; under `ConstrainedPolicy.MASK`, take them out
    of its loss mask, adding the trained tokens that took out to `masked` (by store id)."""
    response_start = len(built.tokens) - len(built.loss_mask)
    stretches = []
    for span in built.spans:
        tag = tags.get(span.turn)
        if tag is None or not tag.constrained:
            continue
        start, end = max(span.start - response_start, 0), span.end - response_start
        if start >= end:
            continue
        stretches.append([start, end])
        if policy is ConstrainedPolicy.MASK:
            trained = int(np.count_nonzero(sample.loss_mask[start:end]))
            if trained:
                sample.loss_mask[start:end] = 0
                masked[span.turn] = masked.get(span.turn, 0) + trained
    if stretches:
        sample.metadata["constrained"] = stretches
        sample.metadata["constrained_tokens"] = sum(end - start for start, end in stretches)


def _chains(
    leaves: Sequence[Node], tags: Mapping[int, TurnTags], train_superseded: bool
) -> list[list[int]]:
    """Every root-to-leaf path's generated turns, as store ids.

    Excluded turns (side conversations) and turns cut short by a client that went away stay in
    the tree and the ledger but in no chain: a later turn that builds on one holds its tokens as
    prompt. A superseded leaf (a retry was
    answered fresh) is left out unless superseded turns train.
    """
    chains = []
    for leaf in leaves:
        if is_superseded(leaf) and not train_superseded:
            continue
        chain = [
            n.turn.id for n in leaf.path() if n.turn is not None and tags[n.turn.id].in_samples
        ]
        if chain:
            chains.append(chain)
    return chains


def _sample(
    sid: str,
    built: _core.BuiltSample,
    generated: dict[int, Node],
    generated_tags: Mapping[int, TurnTags],
    generated_tools: Mapping[int, tuple[str, ...]],
    reward: float,
    extra_metadata: dict[str, Any] | None,
    root: Node,
    prompts: list[tuple[str, Node]],
) -> Sample:
    nodes = [generated[t] for t in built.turns]
    turns: list[StoredTurn] = [n.turn for n in nodes if n.turn is not None]
    last = nodes[-1]
    tags = [generated_tags[t] for t in built.turns]
    withheld = sorted({t for tag in tags for t in tag.withheld_tools})
    media: Counter[str] = Counter()
    for tag in tags:
        if tag.dropped_media:
            media.update(tag.dropped_media)
    metadata: dict[str, Any] = {
        "session_id": sid,
        "chain": built.chain,
        "turns": [n.turn_index for n in nodes],
        "truncated": bool(built.truncated),
        "use_tool": any(generated_tools[t] for t in built.turns),
        "ill_formed": any(t.ill_formed for t in turns),
        "finish_reason": last.turn.finish_reason if last.turn else None,
        "tools": last.tools,
        # The conversation the sample came from (see `trajectory.side`).
        "conversation": conversation_tags(root, last, prompts),
        # Typed tools the harness sent but nobody runs (server tools), withheld from prompts.
        "withheld_tools": withheld,
        # Images/documents its turns' prompts held as placeholders, summed over the turns.
        "dropped_media": dict(sorted(media.items())),
    }
    last_images = tags[-1].images
    if last_images:
        # The images of the last turn's prompt, which the sample's tokens begin with: each
        # one's bytes, processor grid and where its placeholder tokens start.
        metadata["images"] = [dict(i) for i in last_images]
    if any(t.finish_reason == FinishReason.LENGTH for t in turns):
        # A turn cut by its `max_tokens` (spliced as sampled): for a trainer's overlong policy.
        metadata["length_truncated"] = True
    return Sample(
        tokens=built.tokens,
        loss_mask=np.array(built.loss_mask, dtype=np.uint8),
        rollout_log_probs=built.logprobs,
        response_length=len(built.loss_mask),
        reward=reward,
        metadata=metadata,
    )
