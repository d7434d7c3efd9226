"""Replay a journal under other settings, and audit where its generated tokens went.

`replay` runs every served turn through the turn pipeline again offline (restore, prompt ids,
record) with the recorded outputs, so any real run can be re-linearized with restore off,
render history or the upstream merge and compared side by side with what was recorded;
`as_recorded` runs them with the journaled prompt ids.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

import numpy as np

from tokentrail.core.routing import IndexerShape, ReplayRows, RoutingShape
from tokentrail.errors import PolicyError
from tokentrail.kinds import (
    ConstrainedPolicy,
    DriftPolicy,
    History,
    ReplayGap,
    Restore,
    RewritePolicy,
    parse_kind,
)
from tokentrail.messages import Conversation
from tokentrail.storage.journal.read import JournalContents
from tokentrail.storage.journal.record import JournaledTurn
from tokentrail.storage.journal.session import SessionRecord
from tokentrail.text.tokenizer import LoadedTokenizer
from tokentrail.trajectory.ledger import Ledger, ReplayCoverage
from tokentrail.trajectory.linearize import Trajectory
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.pipeline import RecordedPrompt, TurnPipeline
from tokentrail.trajectory.tags import TurnTags


@dataclass(frozen=True)
class Settings:
    """The knobs a replay can turn."""

    restore: Restore = Restore.ON
    history: History = History.SPLICE
    drift_policy: DriftPolicy = DriftPolicy.MINIMAL
    rewrite_policy: RewritePolicy = RewritePolicy.FORK
    fork_threshold: int = 1024
    train_constrained: ConstrainedPolicy = ConstrainedPolicy.MASK
    # The replay shapes the run kept (None: not kept); not a knob, what the journal holds.
    routing: RoutingShape | None = None
    indexer: IndexerShape | None = None

    @classmethod
    def recorded(cls, meta: dict[str, str]) -> Settings:
        """The settings a journal was recorded with (defaults where it does not say)."""
        d = cls()
        routing, indexer = meta.get("routing"), meta.get("indexer")
        return cls(
            restore=parse_kind(Restore, meta.get("restore", d.restore), "restore mode"),
            history=parse_kind(History, meta.get("history", d.history), "history mode"),
            drift_policy=parse_kind(
                DriftPolicy, meta.get("drift_policy", d.drift_policy), "drift policy", PolicyError
            ),
            rewrite_policy=parse_kind(
                RewritePolicy,
                meta.get("rewrite_policy", d.rewrite_policy),
                "rewrite policy",
                PolicyError,
            ),
            fork_threshold=int(meta.get("fork_threshold", d.fork_threshold)),
            train_constrained=parse_kind(
                ConstrainedPolicy,
                meta.get("train_constrained", d.train_constrained),
                "constrained-token policy",
                PolicyError,
            ),
            routing=RoutingShape.parse(routing) if routing else None,
            indexer=IndexerShape.parse(indexer) if indexer else None,
        )

    def describe(self) -> str:
        shown = [f for f in fields(self) if f.name not in ("routing", "indexer")]
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in shown)

    def pipeline(
        self, tokenizer: LoadedTokenizer | None, template: str | None = None
    ) -> TurnPipeline:
        manager = TrajectoryManager(
            fork_threshold_tokens=self.fork_threshold,
            drift_policy=self.drift_policy,
            rewrite_policy=self.rewrite_policy,
            train_constrained=self.train_constrained,
            routing=self.routing,
            indexer=self.indexer,
        )
        return TurnPipeline(
            manager, tokenizer, template, restore=self.restore, history=self.history
        )


def fit_replay(turn: JournaledTurn, manager: TrajectoryManager) -> JournaledTurn:
    """`turn` with the replay rows the manager keeps: rows of another shape than its own (a run
    recorded for another model config) become `SHAPE_MISMATCH`, rows of a channel it does not
    keep are dropped."""

    def fitted(rows: ReplayRows | None, dims: tuple[int, ...] | None) -> ReplayRows | None:
        if dims is None:
            return None
        if rows is not None and rows.rows is not None and rows.rows.shape[1:] != dims[:2]:
            return ReplayRows.missing(ReplayGap.SHAPE_MISMATCH)
        return rows

    routing, indexer = manager.routing, manager.indexer
    return dataclasses.replace(
        turn,
        routed_experts=fitted(turn.routed_experts, routing.dims if routing else None),
        indexer_topk=fitted(turn.indexer_topk, indexer.dims if indexer else None),
    )


def replay_turn(pipeline: TurnPipeline, turn: JournaledTurn, *, as_recorded: bool = True) -> int:
    """Run one journaled turn through `pipeline` again, with its recorded output and reply;
    returns its turn index. The one way a journaled turn is replayed: journal recovery and
    `tokentrail replay` both call it.

    `as_recorded` keeps its journaled prompt ids; otherwise restore, render and prompt ids are
    made anew by the pipeline's settings (and replay rows of a prompt that came out different
    are another sequence's: `RERENDERED_PREFIX`).
    """
    recorded = None
    if as_recorded:
        recorded = RecordedPrompt(turn.prompt_ids, turn.history, turn.fallback)
    # The ids that restored an echo by identity live only in the turn's tags.
    echo_ids = dict(TurnTags.read(turn.metadata).echo_ids)
    prepared = pipeline.prepare(
        turn.sid, Conversation(turn.translated, turn.tools, call_ids=echo_ids), recorded=recorded
    )
    metadata = dict(turn.metadata)
    generated = fit_replay(turn, pipeline.manager)
    if not as_recorded:
        fallback = prepared.fallback
        label = fallback.label if fallback else str(prepared.history)
        metadata = dataclasses.replace(TurnTags.read(metadata), history=label).as_metadata()
        if not np.array_equal(prepared.prompt_ids, turn.prompt_ids):
            # The replay re-rendered the prompt the engine saw: its rows are another sequence's.
            rerendered = ReplayRows.missing(ReplayGap.RERENDERED_PREFIX)
            generated = dataclasses.replace(
                generated,
                routed_experts=None if generated.routed_experts is None else rerendered,
                indexer_topk=None if generated.indexer_topk is None else rerendered,
            )
    return pipeline.record(
        prepared,
        generated,
        turn.response_message,
        ill_formed=turn.ill_formed,
        metadata=metadata,
        supersede=turn.supersedes,
    )


def linearize_record(
    record: SessionRecord,
    pipeline: TurnPipeline,
    *,
    as_recorded: bool = True,
) -> Trajectory:
    """One journaled session run through `pipeline` and linearized.

    `as_recorded` runs its turns with their journaled prompt ids; otherwise restore, render
    and prompt ids are made anew by the pipeline's settings.
    """
    record_session(record, pipeline, as_recorded=as_recorded)
    # The finish's metadata (its group, the trainer's own keys) is in every sample, as the
    # finish answered it.
    trajectory = pipeline.manager.finish(
        record.sid, reward=record.reward, extra_metadata=dict(record.metadata) or None
    )
    trajectory.mark_lost(record.losses())
    pipeline.forget(record.sid)
    return trajectory


def record_session(
    record: SessionRecord,
    pipeline: TurnPipeline,
    *,
    as_recorded: bool = True,
) -> None:
    """Record a journaled session's turns into `pipeline`'s manager, leaving it open there (a
    viewer reads its tree before it is linearized)."""
    by_seq = {
        turn.seq: replay_turn(pipeline, turn, as_recorded=as_recorded) for turn in record.turns
    }
    manager = pipeline.manager
    for seq in record.replays:
        if seq in by_seq:
            manager.answered_again(record.sid, by_seq[seq])


def _run(
    contents: JournalContents,
    pipeline: TurnPipeline,
    *,
    as_recorded: bool,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Trajectory]:
    """Every session, one at a time (a large journal is never held whole)."""
    states = contents.states()
    out = {}
    for done, record in enumerate(contents.records(), 1):
        out[record.sid] = linearize_record(record, pipeline, as_recorded=as_recorded)
        if progress is not None:
            progress(done, len(states))
    return out


def as_recorded(contents: JournalContents) -> dict[str, Trajectory]:
    """Every session linearized exactly as recorded: the journaled prompt ids (no tokenizer
    is needed)."""
    settings = Settings.recorded(contents.meta)
    return _run(contents, settings.pipeline(None), as_recorded=True)


def replay(
    contents: JournalContents,
    settings: Settings,
    tokenizer: LoadedTokenizer,
    template: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Trajectory]:
    """Every session re-run under `settings`: restore, render and prompt ids anew."""
    template = template or contents.meta.get("chat_template") or tokenizer.chat_template
    pipeline = settings.pipeline(tokenizer, template)
    return _run(contents, pipeline, as_recorded=False, progress=progress)


def progress_bar(done: int, total: int) -> None:
    """A one-line progress bar on stderr, for long journals."""
    if not sys.stderr.isatty() and done != total:
        return
    width = 30
    filled = width * done // max(1, total)
    end = "\n" if done == total else ""
    sys.stderr.write(f"\rreplaying [{'#' * filled}{'.' * (width - filled)}] {done}/{total}{end}")
    sys.stderr.flush()


# -- tables ------------------------------------------------------------------------------------


@dataclass
class ToolRow:
    turns: int = 0
    masked_turns: int = 0
    tokens_trained: int = 0
    tokens_masked: int = 0


def tool_rows(ledgers: list[Ledger]) -> dict[str, ToolRow]:
    rows: dict[str, ToolRow] = {}
    for ledger in ledgers:
        for turn in ledger.turns:
            for tool in dict.fromkeys(turn.tools or ["(text)"]):
                row = rows.setdefault(tool, ToolRow())
                row.turns += 1
                row.masked_turns += turn.masked_total > 0
                row.tokens_trained += turn.trained
                row.tokens_masked += turn.masked_total
    return dict(sorted(rows.items()))


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.0f}%" if b else "-"


def side_by_side(
    before: dict[str, Trajectory], after: dict[str, Trajectory], before_name: str, after_name: str
) -> str:
    """Per tool, turns with masked tokens and tokens trained, before -> after."""
    a = tool_rows([t.ledger for t in before.values()])
    b = tool_rows([t.ledger for t in after.values()])
    lines = [
        f"before: {before_name}",
        f"after:  {after_name}",
        "",
        f"{'tool':<12}{'turns':>7}  {'turns with loss_mask=0':>24}  {'tokens trained':>22}",
    ]
    for tool in sorted(set(a) | set(b)):
        x, y = a.get(tool, ToolRow()), b.get(tool, ToolRow())
        masked_cell = f"{_pct(x.masked_turns, x.turns)} -> {_pct(y.masked_turns, y.turns)}"
        trained_cell = f"{x.tokens_trained} -> {y.tokens_trained}"
        lines.append(f"{tool:<12}{x.turns:>7}  {masked_cell:>24}  {trained_cell:>22}")
    for name, trajs in (("before", before), ("after", after)):
        gen = sum(t.ledger.generated_tokens for t in trajs.values())
        trained = sum(t.ledger.trained_tokens for t in trajs.values())
        samples = sum(len(t.samples) for t in trajs.values())
        reasons: dict[str, int] = {}
        for t in trajs.values():
            for reason, n in t.ledger.masked_tokens.items():
                reasons[reason] = reasons.get(reason, 0) + n
        lines.append(
            f"{name:<7} {len(trajs)} sessions, {samples} samples, {trained}/{gen} tokens trained "
            f"({_pct(trained, gen)}), masked {reasons or '{}'}"
        )
    return "\n".join(lines)


def audit_table(ledgers: list[Ledger]) -> tuple[str, float]:
    """Per tool and per reason, turns and tokens trained vs masked; and the masked fraction."""
    rows = tool_rows(ledgers)
    lines = [
        f"{'tool':<12}{'turns':>7}{'turns trained':>15}{'tokens trained':>16}{'tokens masked':>15}"
    ]
    for tool, r in rows.items():
        trained_turns = sum(
            1
            for ledger in ledgers
            for t in ledger.turns
            if tool in (t.tools or ["(text)"]) and t.trained > 0
        )
        lines.append(
            f"{tool:<12}{r.turns:>7}{trained_turns:>15}{r.tokens_trained:>16}{r.tokens_masked:>15}"
        )
    reasons: dict[str, list[int]] = {}
    for ledger in ledgers:
        for t in ledger.turns:
            for reason, n in t.masked.items():
                entry = reasons.setdefault(reason, [0, 0])
                entry[0] += 1
                entry[1] += n
    lines.append("")
    lines.append(f"{'reason':<20}{'turns':>7}{'tokens':>10}")
    for reason, (turns, tokens) in sorted(reasons.items()):
        lines.append(f"{reason:<20}{turns:>7}{tokens:>10}")
    generated = sum(ledger.generated_tokens for ledger in ledgers)
    masked = sum(sum(ledger.masked_tokens.values()) for ledger in ledgers)
    fraction = masked / generated if generated else 0.0
    lines.append("")
    lines.append(
        f"{len(ledgers)} sessions: {generated - masked}/{generated} generated tokens trained, "
        f"masked fraction {fraction:.4f}"
    )
    return "\n".join(lines), fraction


def lost_table(ledgers: Mapping[str, Ledger]) -> tuple[str, int]:
    """The sessions that lost journaled turns before they were linearized, each with what it
    lost; and how many sessions did."""
    damaged = {name: ledger for name, ledger in ledgers.items() if ledger.lost}
    if not damaged:
        return "lost: no session lost journaled turns", 0
    lines = [f"{'session':<24}{'turns lost':>11}{'events lost':>12}  from  reason"]
    for name, ledger in damaged.items():
        for span in ledger.lost:
            turns = "?" if span.turns < 0 else str(span.turns)
            events = "?" if span.events < 0 else str(span.events)
            lines.append(f"{name:<24}{turns:>11}{events:>12}  #{span.first:<4} {span.reason}")
    return "\n".join(lines), len(damaged)


def replay_table(ledgers: list[Ledger]) -> tuple[str, bool]:
    """Per replay channel, sample tokens with and without their rows by reason; and whether
    every ledger kept routing and every token has its rows."""
    totals: dict[str, ReplayCoverage] = {}
    for ledger in ledgers:
        for channel, coverage in ledger.replay.items():
            totals.setdefault(channel, ReplayCoverage()).add(coverage)
    lines = [f"{'replay':<16}{'tokens':>10}{'with rows':>11}{'coverage':>10}  missing"]
    for channel, c in sorted(totals.items()):
        missing = ", ".join(f"{r}={n}" for r, n in sorted(c.missing.items())) or "-"
        lines.append(f"{channel:<16}{c.tokens:>10}{c.present:>11}{c.fraction:>10.2%}  {missing}")
    kept = all(ledger.replay for ledger in ledgers) and bool(ledgers)
    if not kept:
        lines.append("some sessions kept no replay rows at all (served without --routed-experts)")
    return "\n".join(lines), kept and all(c.complete for c in totals.values())
