"""Replay a journal under other settings, and audit where its generated tokens went.

`replay` re-runs every served turn offline (restore, render, prompt ids, record) with the
recorded outputs, so any real run can be re-linearized with restore off, render history or the
upstream merge and compared side by side with what was recorded.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from tokentrail.journal import FINISH, Contents, JournaledTurn
from tokentrail.ledger import Ledger
from tokentrail.manager import Trajectory, TrajectoryManager
from tokentrail.pipeline import Restore, prompt_messages_for_turn
from tokentrail.splice import History, Splicer, prompt_ids_for_turn
from tokentrail.tokenizer import LoadedTokenizer
from tokentrail.turn import TurnRecord


@dataclass(frozen=True)
class Settings:
    """The knobs a replay can turn."""

    restore: Restore = Restore.ON
    history: History = History.SPLICE
    drift_policy: str = "minimal"
    rewrite_policy: str = "fork"
    fork_threshold: int = 1024

    @classmethod
    def recorded(cls, meta: dict[str, str]) -> Settings:
        """The settings a journal was recorded with (defaults where it does not say)."""
        d = cls()
        return cls(
            restore=Restore(meta.get("restore", d.restore)),
            history=History(meta.get("history", d.history)),
            drift_policy=meta.get("drift_policy", d.drift_policy),
            rewrite_policy=meta.get("rewrite_policy", d.rewrite_policy),
            fork_threshold=int(meta.get("fork_threshold", d.fork_threshold)),
        )

    def describe(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))

    def manager(self) -> TrajectoryManager:
        return TrajectoryManager(
            fork_threshold_tokens=self.fork_threshold,
            drift_policy=self.drift_policy,
            rewrite_policy=self.rewrite_policy,
        )


def replay_turn(manager: TrajectoryManager, turn: JournaledTurn, *, restore: Restore) -> None:
    """Record a journaled turn again with its recorded prompt ids, restore included."""
    prompt_messages_for_turn(manager, turn.sid, turn.translated, turn.tools, restore=restore)
    _record(manager, turn, turn.prompt_ids, turn.prompt_messages, turn.metadata)


def _record(
    manager: TrajectoryManager,
    turn: JournaledTurn,
    prompt_ids: Any,
    prompt_messages: list[dict[str, Any]],
    metadata: dict[str, Any],
) -> None:
    manager.record_turn(
        turn.sid,
        turn=TurnRecord(
            prompt_ids,
            turn.output_ids,
            turn.finish_reason,
            turn.logprobs if turn.logprobs is not None else [],
            ill_formed=turn.ill_formed,
        ),
        prompt_messages=prompt_messages,
        response_message=turn.response_message,
        tools=turn.tools,
        metadata=metadata,
    )


def _rewards(contents: Contents) -> dict[str, float]:
    return {
        e.sid: float(e.data.get("reward", 0.0))
        for e in contents.recovery.events
        if e.kind == FINISH
    }


def as_recorded(contents: Contents) -> dict[str, Trajectory]:
    """Every session linearized exactly as recorded: the journaled prompt ids."""
    settings = Settings.recorded(contents.meta)
    manager = settings.manager()
    for turn in contents.served_turns():
        replay_turn(manager, turn, restore=settings.restore)
    rewards = _rewards(contents)
    return {sid: manager.finish(sid, reward=rewards.get(sid, 0.0)) for sid in contents.sessions()}


def replay(
    contents: Contents,
    settings: Settings,
    tokenizer: LoadedTokenizer,
    template: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Trajectory]:
    """Every session re-run under `settings`: restore, render and prompt ids anew."""
    manager = settings.manager()
    template = template or contents.meta.get("chat_template") or tokenizer.chat_template
    splicer = Splicer(tokenizer, template)
    turns = contents.served_turns()
    for done, turn in enumerate(turns, 1):
        messages = prompt_messages_for_turn(
            manager, turn.sid, turn.translated, turn.tools, restore=settings.restore
        )
        render_messages, tools = messages.render, turn.tools
        ids, label, _ = prompt_ids_for_turn(
            manager,
            splicer,
            turn.sid,
            render_messages,
            tools,
            settings.history,
            full_text=lambda m=render_messages, t=tools: splicer.render(m, t, True),
        )
        _record(manager, turn, ids, messages.record, {**turn.metadata, "history": label})
        if progress is not None:
            progress(done, len(turns))
    rewards = _rewards(contents)
    return {sid: manager.finish(sid, reward=rewards.get(sid, 0.0)) for sid in contents.sessions()}


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
        masked = f"{_pct(x.masked_turns, x.turns)} -> {_pct(y.masked_turns, y.turns)}"
        trained = f"{x.tokens_trained} -> {y.tokens_trained}"
        lines.append(f"{tool:<12}{x.turns:>7}  {masked:>24}  {trained:>22}")
    for name, trajs in (("before", before), ("after", after)):
        gen = sum(t.ledger.generated_tokens for t in trajs.values())
        trained = sum(t.ledger.trained_tokens for t in trajs.values())
        samples = sum(len(t.samples) for t in trajs.values())
        masked: dict[str, int] = {}
        for t in trajs.values():
            for reason, n in t.ledger.masked_tokens.items():
                masked[reason] = masked.get(reason, 0) + n
        lines.append(
            f"{name:<7} {len(trajs)} sessions, {samples} samples, {trained}/{gen} tokens trained "
            f"({_pct(trained, gen)}), masked {masked or '{}'}"
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
