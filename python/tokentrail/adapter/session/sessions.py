"""The adapter's sessions: opening, admitting turns, finishing, dropping, evicting idle ones, and
rebuilding the unfinished ones from a journal after a restart.

A session opens by `open` or with the first turn recorded for it: a request refused before its
turn is recorded leaves nothing behind. It admits turns until it is finished, dropped or evicted
(idle past the TTL), and is then closed: a later turn for it is refused (410), never silently
recorded into a new session of the same name, and `/finish` for it says what happened and when.
A finish is kept for a retention window, so a repeated finish (a retry after a lost response)
returns the same samples and ledger; after the window it is a 410.

A session recovered with journaled turns missing (a crash, a damaged journal) carries what it
lost (`trajectory.lost`) into its finish's ledger and samples (`adapter.session.damaged`).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokentrail.adapter.config import SessionSettings
from tokentrail.adapter.metrics import Metrics, replay_warning, warn_if_masked
from tokentrail.adapter.offload import Offload, Settler, trim_memory
from tokentrail.adapter.request.memo import RequestMemo
from tokentrail.adapter.session.damaged import DamagedSessions
from tokentrail.adapter.session.spill import SpilledImages
from tokentrail.adapter.turn.answers import Answers, RecordedAnswer
from tokentrail.errors import (
    InvalidInput,
    Overloaded,
    RateLimited,
    RequestError,
    SessionClosed,
    SessionError,
)
from tokentrail.kinds import Closed, History, JournalEvent, JournalState, Retry
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.record import JournaledTurn
from tokentrail.storage.replay import replay_turn
from tokentrail.text.vision import ImageCache
from tokentrail.trajectory.linearize import Trajectory
from tokentrail.trajectory.lost import LostSpan
from tokentrail.trajectory.pipeline import TurnPipeline
from tokentrail.trajectory.side import SideRules

logger = logging.getLogger(__name__)

# Names of closed sessions kept (to refuse their turns and explain their finish), oldest
# forgotten first past this many.
MAX_TOMBSTONES = 1_000_000


@dataclass
class Session:
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    max_context_tokens: int = 0
    history: History | None = None
    # The session's own side-conversation patterns (beside the adapter's).
    side_rules: SideRules = field(default_factory=SideRules)
    # The session's own rule for retried requests (None: the adapter's).
    retry: Retry | None = None
    # The group it was opened in (a GRPO group's task): every sample's `metadata["group"]`.
    group: str | None = None
    # Its recent recorded replies, for retries, and its turns in flight.
    answers: Answers = field(default_factory=Answers)
    in_flight: int = 0
    turns: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    # Made by a request rather than by `open`: forgotten again unless one of its turns is
    # recorded.
    provisional: bool = False
    last_active: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.idle.set()
        if self.group is not None and (not isinstance(self.group, str) or not self.group):
            raise SessionError("a session's group must be a non-empty string")


@dataclass
class Tombstone:
    """A closed session: how and when it closed, and a finish's result while it is kept."""

    kind: Closed
    at: float | None  # wall-clock seconds; None when only the journal said so
    turns: int = 0
    detail: str = ""
    result: Trajectory | None = None
    kept_until: float = 0.0  # monotonic
    finishing: asyncio.Future[Trajectory] | None = None

    def when(self) -> str:
        if self.at is None:
            return "before the last restart"
        return "at " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at))


def _gone(tomb: Tombstone) -> bool:
    """A finish done whose result is no longer kept."""
    return tomb.result is None and tomb.finishing is None


class Tombstones:
    """Closed sessions by id, oldest forgotten first past `MAX_TOMBSTONES`."""

    def __init__(self, finish_retention_s: float) -> None:
        self.finish_retention_s = finish_retention_s
        self._by_sid: OrderedDict[str, Tombstone] = OrderedDict()
        # Tombstones holding a result, oldest first (the window is the same for all).
        self._kept: deque[Tombstone] = deque()
        # The kept results' image bytes, in a file rather than the heap.
        self.images = SpilledImages()

    def __len__(self) -> int:
        return len(self._by_sid)

    def get(self, sid: str) -> Tombstone | None:
        return self._by_sid.get(sid)

    def pop(self, sid: str) -> None:
        self._by_sid.pop(sid, None)

    def remember(self, sid: str, tomb: Tombstone) -> Tombstone:
        self._by_sid.pop(sid, None)
        self._by_sid[sid] = tomb
        while len(self._by_sid) > MAX_TOMBSTONES:
            self._by_sid.popitem(last=False)
        return tomb

    def keep(self, tomb: Tombstone, result: Trajectory) -> None:
        """Hold a finish's result for the retention window: `images.spill(result)`, its
        images' bytes in the file."""
        tomb.result = result
        tomb.kept_until = time.monotonic() + self.finish_retention_s
        self._kept.append(tomb)

    def kept(self, tomb: Tombstone) -> Trajectory | None:
        """A kept result as the finish answered it (its images' bytes read back)."""
        return None if tomb.result is None else self.images.restore(tomb.result)

    def expire(self, now: float) -> int:
        """Let the kept finishes past the retention window go; returns how many."""
        expired = 0
        while self._kept and self._kept[0].kept_until <= now:
            tomb = self._kept.popleft()
            if tomb.result is not None:
                self.images.release(tomb.result)
            tomb.result = None
            expired += 1
        return expired

    def message(self, sid: str, tomb: Tombstone) -> str:
        """What a turn or a finish for a closed session is told."""
        if tomb.kind is Closed.EVICTED:
            what = (
                f"session {sid!r} was evicted {tomb.when()} {tomb.detail}: its {tomb.turns} "
                "recorded turns were not linearized"
            )
        elif tomb.kind is Closed.FINISHED and tomb.at is not None and _gone(tomb):
            what = (
                f"session {sid!r} was finished {tomb.when()}; its samples were kept "
                f"{self.finish_retention_s:g} s (--finish-retention) and are gone"
            )
        else:
            what = f"session {sid!r} was {tomb.kind.value} {tomb.when()}"
        return f"{what}; a finished or dropped session takes no more turns, open a new session"


def _checked_finish(reward: object, metadata: dict[str, Any] | None) -> dict[str, Any]:
    """A finish's metadata, once its reward and metadata are known to be ones a sample holds."""
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise RequestError("reward must be a number")
    if not math.isfinite(reward):
        raise RequestError(f"reward must be a finite number, got {reward!r}")
    out = dict(metadata or {})
    try:
        json.dumps(out, ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise RequestError(f"metadata must be JSON without NaN or lone surrogates: {exc}") from None
    return out


def _grouped(metadata: dict[str, Any], session: Session | None) -> dict[str, Any]:
    """A finish's metadata with the session's group (`metadata["group"]`), unless it names one."""
    if session is not None and session.group is not None:
        metadata.setdefault("group", session.group)
    return metadata


class Sessions:
    """Every open session of one adapter, over its pipeline, journal and metrics."""

    def __init__(
        self,
        pipeline: TurnPipeline,
        metrics: Metrics,
        *,
        journal: Journal | None = None,
        offload: Offload | None = None,
        max_turns_per_session: int = 0,
        masked_warning_threshold: float = 0.05,
        max_sessions: int = 0,
        idle_ttl_s: float = 0.0,
        finish_retention_s: float = 300.0,
        open_sessions_only: bool = False,
        request_memo: int = 0,
        image_cache: ImageCache | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.manager = pipeline.manager
        self.metrics = metrics
        self.journal = journal
        self.offload = offload or Offload(0)
        self.settler = Settler(self.offload)  # the last finish's memory comes back too
        self.max_turns_per_session = max_turns_per_session
        self.masked_warning_threshold = masked_warning_threshold
        self.max_sessions = max_sessions
        self.idle_ttl_s = idle_ttl_s
        self.finish_retention_s = finish_retention_s
        # Refuse a turn for a session nobody opened, instead of opening it: behind a pool that
        # places sessions, a turn sent to the wrong adapter (or to one whose journal lost the
        # session) must fail loudly, never start a second, partial session of the same name.
        self.open_sessions_only = open_sessions_only
        self._open: dict[str, Session] = {}
        self._closed = Tombstones(finish_retention_s)
        self.lost = DamagedSessions()
        # The latest request of recent sessions, so the next one parses only what is new.
        self.memo = RequestMemo(request_memo)
        # Decoded images by digest; a finished session's are let go.
        self.image_cache = image_cache
        self._tasks: set[asyncio.Future[Any]] = set()

    def __len__(self) -> int:
        return len(self._open)

    def get(self, sid: str) -> Session | None:
        return self._open.get(sid)

    def open_ids(self) -> list[str]:
        """The sessions open now (opened, or recovered from the journal), oldest first."""
        return list(self._open)

    def open(
        self, sid: str, settings: SessionSettings | None = None, *, journaled: bool = True
    ) -> Session:
        """Open (or reopen) a session with its own `settings` (`SessionSettings`)."""
        if not isinstance(sid, str) or not sid:
            raise SessionError("session id must be a non-empty string")
        settings = settings or SessionSettings()
        rules = SideRules.compile(settings.exclude_patterns)
        self._closed.pop(sid)
        session = self._open[sid] = Session(
            dict(settings.sampling_defaults),
            settings.max_context_tokens,
            settings.history,
            rules,
            settings.retry,
            settings.group,
        )
        if self.journal is not None and journaled:
            self.offload.journal_soon(self.journal.session_opened, sid, settings.journaled())
        return session

    # -- turns ----------------------------------------------------------------------------------

    def check_open(self, sid: str) -> None:
        """Refuse a turn for a closed session before any of its request is read (after a
        restart too: the journal knows which sessions ended)."""
        if sid not in self._open and self.journal is not None and self._closed.get(sid) is None:
            ended = self.journal.ended(sid)
            if ended is not None:
                closed = Closed.DROPPED if ended == JournalState.DROPPED else Closed.FINISHED
                self._closed.remember(sid, Tombstone(closed, None))
        tomb = self._closed.get(sid)
        if tomb is not None:
            raise SessionClosed(self._closed.message(sid, tomb))

    def admit(self, sid: str) -> Session:
        """The session a new turn runs in, counted in flight until `release`."""
        self.check_open(sid)
        session = self._open.get(sid)
        if session is None:
            if self.open_sessions_only:
                raise SessionError(f"session {sid!r} was not opened on this adapter")
            if self.max_sessions and len(self._open) >= self.max_sessions:
                raise Overloaded(
                    f"{len(self._open)} sessions are open, the adapter's limit "
                    "(--max-sessions); retry once some are finished or evicted",
                    retry_after_s=5,
                )
            session = self._open[sid] = Session(provisional=True)
        cap = self.max_turns_per_session
        if cap and session.turns + session.in_flight >= cap:
            raise RateLimited(f"session {sid!r} reached its limit of {cap} turns")
        session.in_flight += 1
        session.last_active = time.monotonic()
        session.idle.clear()
        return session

    def release(self, sid: str, session: Session) -> None:
        session.in_flight -= 1
        session.last_active = time.monotonic()
        if session.in_flight:
            return
        session.idle.set()
        if session.provisional and not session.turns and self._open.get(sid) is session:
            # Nothing of it was recorded: it never existed. What the pipeline cached for its
            # prompt goes too, after any step of it still running.
            del self._open[sid]
            self._background(self.offload.run(self._forget, sid, session=sid))

    def after(self, sid: str, step: Callable[[str], object]) -> None:
        """Run `step(sid)` in the session's lane, not awaited (work no reply waits for)."""
        self._background(self.offload.run(step, sid, session=sid))

    def _background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def answered_again(self, sid: str, answer: RecordedAnswer) -> None:
        """A retried request is answered with `answer`: counted in the ledger, the journal
        and the metrics."""
        logger.debug("session %s: a retry answered with turn %d's reply", sid, answer.turn)
        self.manager.answered_again(sid, answer.turn)
        if self.journal is not None and answer.seq:
            self.offload.journal_soon(self.journal.replayed, sid, answer.seq)
        self.metrics.retried(recorded=True)

    # -- finishing ------------------------------------------------------------------------------

    async def finish(
        self, sid: str, *, reward: float = 0.0, metadata: dict[str, Any] | None = None
    ) -> Trajectory:
        """Wait for the session's in-flight turns, close it and linearize it; a repeated
        finish within the retention window returns the same trajectory."""
        metadata = _checked_finish(reward, metadata)
        tomb = self._closed.get(sid)
        if tomb is None:
            session = self._open.get(sid)
            metadata = _grouped(metadata, session)
            if session is None and not self.manager.has_session(sid):
                raise SessionError(f"unknown session {sid!r}")
            tomb = self._closed.remember(sid, Tombstone(Closed.FINISHED, time.time()))
            tomb.finishing = asyncio.ensure_future(
                self._linearize(sid, session, tomb, float(reward), metadata)
            )
            # Its caller may be gone by the time it fails; the failure is still read.
            tomb.finishing.add_done_callback(lambda t: t.cancelled() or t.exception())
        if tomb.finishing is not None:
            # Shielded: a client that goes away mid-finish does not lose the result.
            return await asyncio.shield(tomb.finishing)
        kept = self._closed.kept(tomb)
        if kept is not None and time.monotonic() < tomb.kept_until:
            return kept
        raise SessionClosed(self._closed.message(sid, tomb))

    async def _linearize(
        self,
        sid: str,
        session: Session | None,
        tomb: Tombstone,
        reward: float,
        metadata: dict[str, Any],
    ) -> Trajectory:
        try:
            if session is not None:
                await session.idle.wait()
                self._open.pop(sid, None)
            trajectory = await self.offload.run(
                self._finish_now, sid, reward, metadata, session=sid
            )
        except BaseException:
            self._closed.pop(sid)
            tomb.finishing = None
            raise
        tomb.turns = len(trajectory.ledger.turns)
        self._closed.keep(tomb, await self.offload.run(self._closed.images.spill, trajectory))
        tomb.finishing = None
        self.metrics.session_finished(trajectory)
        warn_if_masked(logger, sid, trajectory.ledger, self.masked_warning_threshold)
        replay = replay_warning(sid, trajectory.ledger)
        if replay is not None:
            logger.warning("%s", replay)
        if self.journal is not None:
            await self.offload.journal(self.journal.session_finished, sid, reward, metadata)
        self.settler.poke()
        return trajectory

    def _finish_now(self, sid: str, reward: float, metadata: dict[str, Any]) -> Trajectory:
        trajectory = self.manager.finish(sid, reward=reward, extra_metadata=metadata)
        trajectory.mark_lost(self.lost.of(sid))
        self._forget(sid)
        if self.image_cache is not None:
            self.image_cache.discard(
                image["digest"]
                for sample in trajectory.samples
                for image in sample.metadata.get("images") or ()
                if isinstance(image, dict) and isinstance(image.get("digest"), str)
            )
        # Closed connections are reference cycles that can hold a request's last buffers (its
        # image) until a full collection, which the frozen startup heap makes rare: collect
        # them now, then hand the freed pages back. Every finish, not at most once a second,
        # so the last of a burst returns its memory too; finishes are far fewer than turns.
        gc.collect()
        trim_memory(0.0)
        return trajectory

    # -- dropping and evicting ------------------------------------------------------------------

    def drop(self, sid: str) -> bool:
        """Forget a session and its turns; False if it was unknown."""
        session = self._open.pop(sid, None)
        known = self.manager.drop_session(sid) or session is not None
        self._forget(sid)
        if known:
            self._dropped(sid, session)
        return known

    async def drop_soon(self, sid: str) -> bool:
        """`drop`, with the tree and the pipeline's state released in a worker."""
        session = self._open.pop(sid, None)
        known = self.manager.has_session(sid) or session is not None
        if known:
            self._dropped(sid, session)
        await self.offload.run(self._discard, sid, session=sid)
        self.settler.poke()
        return known

    def _dropped(self, sid: str, session: Session | None) -> None:
        self._closed.remember(sid, Tombstone(Closed.DROPPED, time.time()))
        if self.journal is not None:
            self.offload.journal_soon(self.journal.session_dropped, sid)
        self.metrics.session_dropped()

    def _forget(self, sid: str) -> None:
        self.pipeline.forget(sid)
        self.memo.forget(sid)

    def _discard(self, sid: str) -> None:
        self.manager.drop_session(sid)
        self._forget(sid)
        trim_memory()

    async def sweep(self) -> list[str]:
        """Evict sessions idle past the TTL and let kept finishes past the retention window go;
        returns the evicted ids."""
        now = time.monotonic()
        if self._closed.expire(now):
            await self.offload.run(trim_memory)
        if not self.idle_ttl_s:
            return []
        stale = [
            (sid, s)
            for sid, s in self._open.items()
            if not s.in_flight and now - s.last_active > self.idle_ttl_s
        ]
        for sid, session in stale:
            await self._evict(sid, session, now - session.last_active)
        return [sid for sid, _ in stale]

    async def _evict(self, sid: str, session: Session, idle_s: float) -> None:
        if self._open.get(sid) is not session:
            return
        del self._open[sid]
        turns = self.manager.turn_count(sid)
        self._closed.remember(
            sid,
            Tombstone(
                Closed.EVICTED,
                time.time(),
                turns,
                f"after {idle_s:.0f} s idle (--session-idle-ttl)",
            ),
        )
        if self.journal is not None:
            details = {"evicted": {"idle_s": round(idle_s, 1), "turns": turns}}
            self.offload.journal_soon(self.journal.session_dropped, sid, details)
        self.metrics.session_evicted()
        logger.warning(
            "session %s evicted after %.0f s idle (--session-idle-ttl %g): its %d recorded turns "
            "were not linearized%s",
            sid,
            idle_s,
            self.idle_ttl_s,
            turns,
            "; the journal still holds them" if self.journal is not None else "",
        )
        await self.offload.run(self._discard, sid, session=sid)


# -- recovery -----------------------------------------------------------------------------------


def recover(sessions: Sessions, journal: Journal) -> None:
    """Rebuild the unfinished sessions of a journal: every turn runs through the pipeline again
    with its recorded prompt ids and output, and keeps its reply for retries. Finished sessions
    are not read (`Journal.ended` answers for them when asked)."""
    turn_of: dict[int, int] = {}  # session sequence number -> turn index, per session
    current = None
    for event in journal.live_events():
        if event.sid != current:
            current, turn_of = event.sid, {}
            sessions._open.setdefault(event.sid, Session())
        if event.kind is JournalEvent.OPEN:
            sessions.open(event.sid, SessionSettings.from_journal(event.data), journaled=False)
        elif event.kind is JournalEvent.TURN and event.turn is not None:
            index = _recover_turn(sessions, event.turn)
            if index is not None:
                turn_of[event.seq] = index
        elif event.kind is JournalEvent.REPLAY and int(event.data["turn"]) in turn_of:
            sessions.manager.answered_again(event.sid, turn_of[int(event.data["turn"])])
        elif event.kind is JournalEvent.LOST:
            sessions.lost.note(event.sid, LostSpan.from_dict(event.data))
    live = journal.recovery.live
    if live:
        logger.info("journal: rebuilt %d unfinished sessions", len(live))
    if sessions.lost:
        logger.warning(
            "journal: %d of %d recovered sessions lost journaled turns; their finish states it",
            len(sessions.lost),
            len(live),
        )


def _recover_turn(sessions: Sessions, turn: JournaledTurn) -> int | None:
    try:
        index = replay_turn(sessions.pipeline, turn)
    except InvalidInput as exc:
        logger.warning(
            "journal: session %s, turn #%d cannot be recorded again (%s); skipped",
            turn.sid,
            turn.seq,
            exc,
        )
        reason = f"turn #{turn.seq} cannot be recorded again ({exc})"
        sessions.lost.note(turn.sid, LostSpan(turn.seq, 1, 1, reason))
        return None
    session = sessions._open.setdefault(turn.sid, Session())
    session.turns += 1
    answer = RecordedAnswer.from_journal(index, turn.seq, turn.answer)
    if answer is not None:
        session.answers.remember(answer)
    return index
