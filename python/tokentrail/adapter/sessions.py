"""The adapter's sessions: opening, admitting turns, finishing, dropping, and rebuilding the
unfinished ones from a journal after a restart.

A session opens on its first request (or by `open`, with sampling defaults, a history mode and
a retry rule of its own), admits turns until it is finished or dropped, and is then closed: a
later turn for it is refused, never silently recorded into a new session of the same name (after
a restart too: the journal knows which sessions ended).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from tokentrail.adapter.answers import Answers, RecordedAnswer
from tokentrail.adapter.metrics import Metrics, warn_if_masked
from tokentrail.errors import RateLimited, SessionClosed, SessionError, TokentrailError
from tokentrail.kinds import History, JournalEvent, Retry
from tokentrail.messages import Conversation, Message
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal_format import JournaledTurn
from tokentrail.trajectory.manager import Trajectory
from tokentrail.trajectory.pipeline import Generated, PreparedTurn, RecordedPrompt, TurnPipeline

logger = logging.getLogger(__name__)


@dataclass
class Session:
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    max_context_tokens: int = 0
    history: History | None = None
    retry: Retry | None = None
    in_flight: int = 0
    turns: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    answers: Answers = field(default_factory=Answers)

    def __post_init__(self) -> None:
        self.idle.set()


class Sessions:
    """Every open session of one adapter, over its pipeline, journal and metrics."""

    def __init__(
        self,
        pipeline: TurnPipeline,
        metrics: Metrics,
        *,
        journal: Journal | None = None,
        max_turns_per_session: int = 0,
        masked_warning_threshold: float = 0.05,
    ) -> None:
        self.pipeline = pipeline
        self.manager = pipeline.manager
        self.metrics = metrics
        self.journal = journal
        self.max_turns_per_session = max_turns_per_session
        self.masked_warning_threshold = masked_warning_threshold
        self._open: dict[str, Session] = {}
        self._closed: set[str] = set()

    def __len__(self) -> int:
        return len(self._open)

    def get(self, sid: str) -> Session | None:
        return self._open.get(sid)

    def open(
        self,
        sid: str,
        sampling_defaults: dict[str, Any] | None = None,
        max_context_tokens: int = 0,
        history: History | str | None = None,
        retry: Retry | str | None = None,
        *,
        journaled: bool = True,
    ) -> Session:
        """Open (or reopen) a session; `sampling_defaults` fill what a request leaves out,
        `history` and `retry` override the adapter's for this session."""
        if not isinstance(sid, str) or not sid:
            raise SessionError("session id must be a non-empty string")
        self._closed.discard(sid)
        session = self._open[sid] = Session(
            dict(sampling_defaults or {}),
            int(max_context_tokens),
            History(history) if history is not None else None,
            Retry(retry) if retry is not None else None,
        )
        if self.journal is not None and journaled:
            self.journal.session_opened(
                sid,
                {
                    "sampling_defaults": dict(sampling_defaults or {}),
                    "max_context_tokens": int(max_context_tokens),
                    "history": str(history) if history is not None else None,
                    "retry": str(retry) if retry is not None else None,
                },
            )
        return session

    def admit(self, sid: str) -> Session:
        """The session a new turn runs in, counted in flight until `release`."""
        session = self._open.get(sid)
        if session is None and self.journal is not None and self.journal.ended(sid):
            self._closed.add(sid)
        if sid in self._closed:
            raise SessionClosed(f"session {sid!r} was finished or dropped; open a new session")
        if session is None:
            session = self._open[sid] = Session()
        cap = self.max_turns_per_session
        if cap and session.turns + session.in_flight >= cap:
            raise RateLimited(f"session {sid!r} reached its limit of {cap} turns")
        session.in_flight += 1
        session.idle.clear()
        return session

    def record(
        self,
        session: Session,
        conversation: Conversation,
        prepared: PreparedTurn,
        generation: Generated,
        message: Message,
        *,
        ill_formed: bool,
        metadata: dict[str, Any],
        answer: RecordedAnswer,
        supersede: bool,
    ) -> RecordedAnswer:
        """Journal a generated turn (before anything else: a crash from here on must not lose
        it), record it, and keep its reply for retries; returns the reply as kept."""
        seq = 0
        if self.journal is not None:
            seq = self.journal.turn(
                prepared.sid,
                translated=conversation.messages,
                response_message=message,
                tools=conversation.tools,
                prompt_ids=prepared.prompt_ids,
                output_ids=generation.output_ids,
                logprobs=generation.logprobs,
                finish_reason=generation.finish_reason,
                ill_formed=ill_formed,
                metadata=metadata,
                history=prepared.history,
                fallback=prepared.fallback,
                answer=answer.journaled(),
                supersedes=supersede,
            )
        index = self.pipeline.record(
            prepared,
            generation,
            message,
            ill_formed=ill_formed,
            metadata=metadata,
            supersede=supersede,
        )
        session.turns += 1
        answer = dataclasses.replace(answer, turn=index, seq=seq)
        session.answers.remember(answer)
        return answer

    def answered_again(self, sid: str, answer: RecordedAnswer) -> None:
        """A retried request is answered with `answer`: counted in the ledger, the journal
        and the metrics."""
        logger.debug("session %s: a retry answered with turn %d's reply", sid, answer.turn)
        self.manager.answered_again(sid, answer.turn)
        if self.journal is not None and answer.seq:
            self.journal.replayed(sid, answer.seq)
        self.metrics.retried(recorded=True)

    @staticmethod
    def release(session: Session) -> None:
        session.in_flight -= 1
        if session.in_flight == 0:
            session.idle.set()

    async def finish(
        self, sid: str, *, reward: float = 0.0, metadata: dict[str, Any] | None = None
    ) -> Trajectory:
        """Wait for the session's in-flight turns, close it and linearize it."""
        session = self._open.get(sid)
        if session is None and not self.manager.has_session(sid):
            raise SessionError(f"unknown session {sid!r}")
        self._closed.add(sid)
        if session is not None:
            await session.idle.wait()
            self._open.pop(sid, None)
        trajectory = self.manager.finish(sid, reward=reward, extra_metadata=metadata)
        self.pipeline.forget(sid)
        if self.journal is not None:
            self.journal.session_finished(sid, reward, metadata or {})
        self.metrics.session_finished(trajectory)
        warn_if_masked(logger, sid, trajectory.ledger, self.masked_warning_threshold)
        return trajectory

    def drop(self, sid: str) -> bool:
        """Forget a session and its turns; False if it was unknown."""
        known = self._open.pop(sid, None) is not None
        known = self.manager.drop_session(sid) or known
        self.pipeline.forget(sid)
        self._closed.add(sid)
        if known and self.journal is not None:
            self.journal.session_dropped(sid)
        if known:
            self.metrics.session_dropped()
        return known

    def recover(self, journal: Journal) -> None:
        """Rebuild the unfinished sessions of a journal: every turn runs through the pipeline
        again with its recorded prompt ids and output, and keeps its reply for retries."""
        turn_of: dict[int, int] = {}  # session sequence number -> turn index, per session
        current = None
        for event in journal.live_events():
            if event.sid != current:
                current, turn_of = event.sid, {}
                self._open.setdefault(event.sid, Session())
            if event.kind is JournalEvent.OPEN:
                settings = event.data
                self.open(
                    event.sid,
                    settings.get("sampling_defaults"),
                    settings.get("max_context_tokens", 0),
                    settings.get("history"),
                    settings.get("retry"),
                    journaled=False,
                )
            elif event.kind is JournalEvent.TURN and event.turn is not None:
                index = self._recover_turn(event.turn)
                if index is not None:
                    turn_of[event.seq] = index
            elif event.kind is JournalEvent.REPLAY and int(event.data["turn"]) in turn_of:
                self.manager.answered_again(event.sid, turn_of[int(event.data["turn"])])
        live = journal.recovery.live
        if live:
            logger.info("journal: rebuilt %d unfinished sessions", len(live))

    def _recover_turn(self, turn: JournaledTurn) -> int | None:
        try:
            prepared = self.pipeline.prepare(
                turn.sid,
                Conversation(turn.translated, turn.tools),
                recorded=RecordedPrompt(turn.prompt_ids, turn.history, turn.fallback),
            )
            index = self.pipeline.record(
                prepared,
                turn,
                turn.response_message,
                ill_formed=turn.ill_formed,
                metadata=turn.metadata,
                supersede=turn.supersedes,
            )
        except TokentrailError as exc:
            logger.warning(
                "journal: session %s, turn #%d cannot be recorded again (%s); skipped",
                turn.sid,
                turn.seq,
                exc,
            )
            return None
        session = self._open.setdefault(turn.sid, Session())
        session.turns += 1
        answer = RecordedAnswer.from_journal(index, turn.seq, turn.answer)
        if answer is not None:
            session.answers.remember(answer)
        return index
