"""The adapter's sessions: opening, admitting turns, finishing, dropping, and rebuilding the
unfinished ones from a journal after a restart.

A session opens on its first request (or by `open`, with sampling defaults and a history mode
of its own), admits turns until it is finished or dropped, and is then closed: a later turn for
it is refused, never silently recorded into a new session of the same name.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from tokentrail.adapter.metrics import Metrics, warn_if_masked
from tokentrail.errors import RateLimited, SessionClosed, SessionError
from tokentrail.kinds import History
from tokentrail.messages import Conversation
from tokentrail.storage.journal import OPEN, TURN, Journal, decode_turn
from tokentrail.trajectory.manager import Trajectory
from tokentrail.trajectory.pipeline import RecordedPrompt, TurnPipeline

logger = logging.getLogger(__name__)


@dataclass
class Session:
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    max_context_tokens: int = 0
    history: History | None = None
    in_flight: int = 0
    turns: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

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
        open_sessions_only: bool = False,
    ) -> None:
        self.pipeline = pipeline
        self.manager = pipeline.manager
        self.metrics = metrics
        self.journal = journal
        self.max_turns_per_session = max_turns_per_session
        self.masked_warning_threshold = masked_warning_threshold
        # Refuse a turn for a session nobody opened, instead of opening it: behind a pool that
        # places sessions, a turn sent to the wrong adapter (or to one whose journal lost the
        # session) must fail loudly, never start a second, partial session of the same name.
        self.open_sessions_only = open_sessions_only
        self._open: dict[str, Session] = {}
        self._closed: set[str] = set()

    def __len__(self) -> int:
        return len(self._open)

    def get(self, sid: str) -> Session | None:
        return self._open.get(sid)

    def open_ids(self) -> list[str]:
        """The sessions open now (opened, or recovered from the journal), oldest first."""
        return list(self._open)

    def open(
        self,
        sid: str,
        sampling_defaults: dict[str, Any] | None = None,
        max_context_tokens: int = 0,
        history: History | str | None = None,
        *,
        journaled: bool = True,
    ) -> Session:
        """Open (or reopen) a session; `sampling_defaults` fill what a request leaves out,
        `history` overrides the adapter's for this session."""
        if not isinstance(sid, str) or not sid:
            raise SessionError("session id must be a non-empty string")
        self._closed.discard(sid)
        session = self._open[sid] = Session(
            dict(sampling_defaults or {}),
            int(max_context_tokens),
            History(history) if history is not None else None,
        )
        if self.journal is not None and journaled:
            self.journal.session_opened(
                sid,
                {
                    "sampling_defaults": dict(sampling_defaults or {}),
                    "max_context_tokens": int(max_context_tokens),
                    "history": str(history) if history is not None else None,
                },
            )
        return session

    def admit(self, sid: str) -> Session:
        """The session a new turn runs in, counted in flight until `release`."""
        if sid in self._closed:
            raise SessionClosed(f"session {sid!r} was finished or dropped; open a new session")
        session = self._open.get(sid)
        if session is None:
            if self.open_sessions_only:
                raise SessionError(f"session {sid!r} was not opened on this adapter")
            session = self._open[sid] = Session()
        cap = self.max_turns_per_session
        if cap and session.turns + session.in_flight >= cap:
            raise RateLimited(f"session {sid!r} reached its limit of {cap} turns")
        session.in_flight += 1
        session.idle.clear()
        return session

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
        """Rebuild the unfinished sessions of a journal: every served turn runs through the
        pipeline again with its recorded prompt ids and output."""
        live = set(journal.recovery.unfinished_sessions())
        retracted = journal.recovery.retracted()
        try:
            for event in journal.events():
                if event.sid not in live:
                    self._closed.add(event.sid)
                    continue
                if event.kind == OPEN:
                    settings = event.data
                    self.open(
                        event.sid,
                        settings.get("sampling_defaults"),
                        settings.get("max_context_tokens", 0),
                        settings.get("history"),
                        journaled=False,
                    )
                elif event.kind == TURN and event.seq not in retracted:
                    turn = decode_turn(journal, event)
                    prepared = self.pipeline.prepare(
                        turn.sid,
                        Conversation(turn.translated, turn.tools),
                        recorded=RecordedPrompt(turn.prompt_ids, turn.history, turn.fallback),
                    )
                    self.pipeline.record(
                        prepared,
                        turn,
                        turn.response_message,
                        ill_formed=turn.ill_formed,
                        metadata=turn.metadata,
                    )
                    session = self._open.setdefault(event.sid, Session())
                    session.turns += 1
        finally:
            journal.release()
        if live:
            logger.info("journal: rebuilt %d unfinished sessions", len(live))
