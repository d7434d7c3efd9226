"""Reading one session's events back: checked one by one, decoded in order, stopped at damage.

A session's events are read in order of their session sequence number; each must be the next
number and match its CRC. At the first that is not (missing, damaged, undecodable) the session
stops there: what came before is kept, the rest is reported in `SessionDamage`.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tokentrail.errors import JournalError
from tokentrail.kinds import JournalEvent, JournalState, parse_kind
from tokentrail.messages import ToolSchema
from tokentrail.storage.journal.format import (
    END_STATES,
    ROW_COLUMNS,
    Row,
    TurnDecoder,
)
from tokentrail.storage.journal.images import ImageReader
from tokentrail.storage.journal.record import JournaledTurn
from tokentrail.trajectory.lost import UNKNOWN, LostSpan


@dataclass
class SessionDamage:
    """What could not be recovered of one session."""

    sid: str
    first: int  # the session sequence number of the first event not recovered
    lost: int  # events from `first` on that were not recovered (-1: unknown)
    reason: str
    turns: int = UNKNOWN  # how many of those were generated turns (-1: unknown)

    def describe(self) -> str:
        count = "an unknown number of" if self.lost < 0 else str(self.lost)
        turns = "" if self.turns < 0 else f" ({self.turns} turns)"
        return (
            f"session {self.sid}: {count} events{turns} from #{self.first} on lost ({self.reason})"
        )

    def span(self) -> LostSpan:
        return LostSpan(self.first, self.lost, self.turns, self.reason)

    def counted(self, kinds: dict[int, str]) -> SessionDamage:
        """This damage with its lost events' and turns' counts taken from `kinds` (the
        session's events by sequence number, as its receipts name them) where they name every
        lost one."""
        named = {n: kind for n, kind in kinds.items() if n >= self.first}
        if not named or (self.lost >= 0 and len(named) < self.lost):
            return self
        if self.lost < 0 and sorted(named) != list(range(self.first, self.first + len(named))):
            return self
        turns = sum(1 for kind in named.values() if kind == JournalEvent.TURN)
        return dataclasses.replace(self, lost=max(self.lost, len(named)), turns=turns)


def tail_lost(sid: str, events: list[tuple[int, str]], first: int = 0) -> SessionDamage:
    """The damage of a session whose events `events` ((number, kind), from its receipts)
    were committed but are not in the file: a lost WAL tail."""
    turns = sum(1 for _, kind in events if kind == JournalEvent.TURN)
    first = first or min(n for n, _ in events)
    return SessionDamage(sid, first, len(events), "the WAL tail holding them was lost", turns)


@dataclass
class Event:
    """One decoded event of a session."""

    sid: str
    seq: int
    kind: JournalEvent
    data: dict[str, Any]
    turn: JournaledTurn | None = None


@dataclass
class SessionRecord:
    """A whole session read back (for replay, export and check)."""

    sid: str
    state: str
    settings: dict[str, Any] | None = None
    turns: list[JournaledTurn] = field(default_factory=list)
    # Session sequence numbers of turns answered again to a retry, one entry per answer.
    replays: list[int] = field(default_factory=list)
    # What recovery once reported lost of this session (its `lost` events).
    lost: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    damage: str | None = None
    # The damage behind `damage`, where it was found reading the session's own events.
    found: SessionDamage | None = None
    events: int = 0

    def losses(self) -> list[LostSpan]:
        """Everything the session lost: what recovery reported then (its `lost` events), and
        damage found now, reading it."""
        spans = [LostSpan.from_dict(d) for d in self.lost]
        if self.found is not None:
            spans.append(self.found.span())
        elif self.damage is not None:
            spans.append(LostSpan(self.events + 1, UNKNOWN, UNKNOWN, self.damage))
        return spans

    def add(self, event: Event) -> None:
        self.events += 1
        kind = event.kind
        if kind is JournalEvent.OPEN:
            self.settings = event.data
        elif kind is JournalEvent.TURN and event.turn is not None:
            self.turns.append(event.turn)
        elif kind is JournalEvent.REPLAY:
            self.replays.append(int(event.data["turn"]))
        elif kind is JournalEvent.LOST:
            self.lost.append(event.data)
        elif kind in END_STATES:
            self.state = END_STATES[kind]
            if self.state == JournalState.FINISHED:
                self.reward = float(event.data.get("reward", 0.0))
                self.metadata = dict(event.data.get("metadata") or {})


class Blobs:
    """Tool lists by hash, read from `blobs` once each and checked."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._cache: dict[str, list[ToolSchema]] = {}

    def __call__(self, ref: str) -> list[ToolSchema]:
        tools = self._cache.get(ref)
        if tools is None:
            row = self._db.execute("SELECT data, crc FROM blobs WHERE hash = ?", (ref,)).fetchone()
            if row is None:
                raise JournalError(f"tool list {ref} is missing")
            if zlib.crc32(row[0]) != row[1]:
                raise JournalError(f"tool list {ref}: checksum mismatch")
            tools = self._cache[ref] = json.loads(row[0])
        return tools


def session_rows(db: sqlite3.Connection, sid: str) -> Iterator[Row]:
    cursor = db.execute(f"SELECT {ROW_COLUMNS} FROM events WHERE sid = ? ORDER BY sess_seq", (sid,))
    for values in cursor:
        yield Row(*values)


def decode_events(
    sid: str,
    rows: Iterator[Row],
    expected: int,
    tools_of: Callable[[str], list[ToolSchema]],
    images: ImageReader,
    damage: list[SessionDamage],
    decoder: TurnDecoder | None = None,
) -> Iterator[Event]:
    """The session's events in order, checked and decoded; at the first bad one, a
    `SessionDamage` is appended to `damage` and the iteration ends.

    `expected` is the last sequence number the session should reach (0: not known); a turn
    whose image is missing or damaged in `images` is a damaged event.
    """
    decoder = decoder or TurnDecoder(sid)
    nxt = 1
    try:
        for row in rows:
            if row.sess_seq != nxt:
                raise _Bad(nxt, f"event #{nxt} is missing")
            if row.sid != sid or not row.verify():
                raise _Bad(nxt, f"event #{nxt}: checksum mismatch")
            try:
                kind = parse_kind(JournalEvent, row.kind, "journal event", JournalError)
                data = row.data()
                turn = None
                if kind is JournalEvent.TURN:
                    turn = decoder.decode(row.sess_seq, data, row.ids, tools_of, images)
            except (ValueError, KeyError, TypeError, JournalError, zlib.error) as exc:
                raise _Bad(nxt, f"event #{nxt} cannot be decoded ({exc})") from None
            yield Event(sid, row.sess_seq, kind, data, turn)
            nxt += 1
        if expected and nxt <= expected:
            raise _Bad(nxt, f"events #{nxt}-#{expected} are missing")
    except _Bad as bad:
        lost = expected - bad.first + 1 if expected >= bad.first else -1
        damage.append(SessionDamage(sid, bad.first, lost, bad.reason))
    except sqlite3.DatabaseError as exc:
        lost = expected - nxt + 1 if expected >= nxt else -1
        damage.append(SessionDamage(sid, nxt, lost, f"unreadable page ({exc})"))


class _Bad(Exception):
    def __init__(self, first: int, reason: str) -> None:
        super().__init__(reason)
        self.first = first
        self.reason = reason


def read_record(
    db: sqlite3.Connection,
    sid: str,
    state: str,
    expected: int,
    tools_of: Callable[[str], list[ToolSchema]],
) -> SessionRecord:
    """One whole session, as far as it is intact (its images read for it alone)."""
    record = SessionRecord(sid, state if state else JournalState.LIVE)
    damage: list[SessionDamage] = []
    rows = session_rows(db, sid)
    for event in decode_events(sid, rows, expected, tools_of, ImageReader(db), damage):
        record.add(event)
    if damage:
        record.found = damage[0]
        record.damage = damage[0].describe()
    return record
