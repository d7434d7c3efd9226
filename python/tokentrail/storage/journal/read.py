"""Reading a journal without changing it: its sessions one at a time, and a full check.

`read_journal` serves replay, audit and export: sessions come back one at a time
(`JournalContents.records`), so reading a large journal holds one session, not the file.
`check_journal` reads every row of the file and reports, per session, what is intact and what
is missing or damaged, as `tokentrail journal check` prints it. Both read schemas 1 to 3.
"""

from __future__ import annotations

import logging
import sqlite3
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tokentrail.errors import JournalError
from tokentrail.kinds import JournalEvent, JournalState, parse_kind
from tokentrail.storage.journal.format import (
    END_STATES,
    ROW_COLUMNS,
    SAME_EVENTS,
    Row,
    session_crc,
)
from tokentrail.storage.journal.receipts import (
    lost_events,
    parse_line,
    receipts_path,
    session_kinds,
)
from tokentrail.storage.journal.record import JournaledTurn
from tokentrail.storage.journal.scan import Scan, readable, scan_rows
from tokentrail.storage.journal.session import Blobs, SessionRecord, read_record, tail_lost
from tokentrail.storage.journal.v1 import read_v1, schema_version

logger = logging.getLogger(__name__)


@dataclass
class JournalContents:
    """A journal opened for reading; its sessions are read when asked for."""

    path: Path
    meta: dict[str, str]
    version: int

    def records(self) -> Iterator[SessionRecord]:
        """Every session, in order of its first event, read as far as it is intact."""
        if self.version == 1:
            yield from read_v1(self.path)[1]
            return
        receipts = receipts_path(self.path)
        upto = receipts.stat().st_size if receipts.exists() else 0
        with readable(self.path) as (db, _):
            (top,) = db.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()
            # Events committed past the file's end (a lost WAL tail no server has reported yet).
            lost = lost_events(receipts, int(top), upto)
            blobs = Blobs(db)
            kinds: dict[str, dict[int, str]] | None = None  # read from the receipts if needed
            for sid, state, last in _sessions(db):
                record = read_record(db, sid, state, last, blobs)
                if sid in lost and record.damage is None:
                    record.found = tail_lost(sid, lost[sid])
                    record.damage = record.found.describe()
                elif record.found is not None:
                    # What the lost events were, where the receipts name them.
                    kinds = session_kinds(receipts) if kinds is None else kinds
                    record.found = record.found.counted(kinds.get(sid, {}))
                    record.damage = record.found.describe()
                if record.damage:
                    logger.warning("journal %s: %s", self.path, record.damage)
                yield record

    def states(self) -> dict[str, str]:
        """Every session's state (live, finished, dropped), in order of its first event."""
        if self.version == 1:
            return {r.sid: r.state for r in read_v1(self.path)[1]}
        with readable(self.path) as (db, _):
            return {sid: state for sid, state, _last in _sessions(db)}

    def sessions(self) -> list[str]:
        return list(self.states())

    def served_turns(self) -> list[JournaledTurn]:
        """Every turn of every session, in memory (for small journals)."""
        return [t for r in self.records() for t in r.turns]


def read_journal(path: str | Path) -> JournalContents:
    """A journal for reading (replay, audit, export); nothing in it is changed."""
    path = Path(path)
    if not path.exists():
        raise JournalError(f"no journal at {path}")
    with readable(path) as (db, refused):
        if refused:
            logger.warning("journal %s: %s; reading what is left", path, refused)
        version = schema_version(db)
        try:
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError:
            meta = {}
    if version not in (1, *SAME_EVENTS):
        raise JournalError(f"journal {path}: unknown schema {version}")
    return JournalContents(path, meta, version)


def _sessions(db: sqlite3.Connection) -> list[tuple[str, str, int]]:
    """(sid, state, last number) of every session, from the index when it is intact."""
    try:
        rows = db.execute("SELECT sid, state, last, first, crc FROM sessions ORDER BY first")
        out = []
        for sid, state, last, first, crc in rows:
            if session_crc(sid, state, last, first) != crc:
                raise sqlite3.DatabaseError(f"index entry of {sid!r} fails its checksum")
            out.append((sid, state, last))
        return out
    except sqlite3.DatabaseError:
        found = db.execute("SELECT DISTINCT sid FROM events").fetchall()
        return [(sid, JournalState.LIVE, 0) for (sid,) in found]


# -- check -------------------------------------------------------------------------------------


@dataclass
class SessionCheck:
    sid: str
    state: str = JournalState.LIVE
    events: int = 0
    turns: int = 0
    expected: int = 0
    # The first event number found missing or damaged, and why; events recovery already
    # marked lost.
    first_bad: int = 0
    problem: str | None = None
    lost_before: int = 0
    _next: int = 1

    @property
    def status(self) -> str:
        if self.problem is not None:
            return f"DAMAGED from #{self.first_bad}: {self.problem}"
        if self.lost_before:
            return f"ok ({self.lost_before} events lost earlier, reported then)"
        return "ok"

    def bad(self, at: int, why: str) -> None:
        if self.problem is None:
            self.first_bad, self.problem = at, why


@dataclass
class CheckReport:
    path: Path
    version: int
    sessions: dict[str, SessionCheck] = field(default_factory=dict)
    unattributed: int = 0
    refused: str | None = None
    bad_blobs: int = 0
    bad_images: int = 0

    @property
    def damaged(self) -> list[SessionCheck]:
        return [s for s in self.sessions.values() if s.problem is not None]

    @property
    def ok(self) -> bool:
        bad_stored = self.bad_blobs or self.bad_images
        return not self.damaged and not self.unattributed and not bad_stored

    def table(self) -> str:
        live = sum(1 for s in self.sessions.values() if s.state == JournalState.LIVE)
        events = sum(s.events for s in self.sessions.values())
        lines = [
            f"journal {self.path}: schema {self.version}, {len(self.sessions)} sessions "
            f"({live} unfinished), {events} events readable",
        ]
        if self.refused:
            lines.append(f"the file itself: {self.refused} (read through a salvage copy)")
        width = max([7, *(len(s) for s in self.sessions)]) + 2
        lines.append(f"{'session':<{width}}{'state':<10}{'events':>8}{'turns':>7}  status")
        for s in self.sessions.values():
            lines.append(f"{s.sid:<{width}}{s.state:<10}{s.events:>8}{s.turns:>7}  {s.status}")
        if self.unattributed:
            lines.append(f"{self.unattributed} damaged events could not be tied to a session")
        if self.bad_blobs:
            lines.append(f"{self.bad_blobs} tool lists fail their checksum")
        if self.bad_images:
            lines.append(f"{self.bad_images} images fail their checksum")
        damaged = len(self.damaged)
        lines.append("ok: every event is intact" if self.ok else f"{damaged} sessions damaged")
        return "\n".join(lines)


def check_journal(path: str | Path) -> CheckReport:
    """Read every row of a journal and report what is intact, per session."""
    path = Path(path)
    if not path.exists():
        raise JournalError(f"no journal at {path}")
    with readable(path) as (db, refused):
        version = schema_version(db)
        if version == 1:
            return _check_v1(path, refused)
        report = CheckReport(path, version, refused=refused)
        _check_v2(db, path, report)
    return report


def _check_v1(path: Path, refused: str | None) -> CheckReport:
    report = CheckReport(path, 1, refused=refused)
    for record in read_v1(path)[1]:
        s = report.sessions[record.sid] = SessionCheck(record.sid, record.state)
        s.turns = s.events = len(record.turns)
        if record.damage:
            s.bad(len(record.turns) + 1, record.damage)
    return report


def _check_v2(db: sqlite3.Connection, path: Path, report: CheckReport) -> None:
    sessions = report.sessions
    try:
        for sid, state, last, first, crc in db.execute(
            "SELECT sid, state, last, first, crc FROM sessions ORDER BY first"
        ):
            s = sessions[sid] = SessionCheck(sid, state, expected=last)
            if session_crc(sid, state, last, first) != crc:
                s.bad(1, "its index entry fails its checksum")
    except sqlite3.DatabaseError as exc:
        report.refused = report.refused or f"session index unreadable ({exc})"
    scan = Scan()
    damaged_rows: list[int] = []
    top = 0
    receipts = receipts_path(path)
    # Receipts written from now on belong to events a running writer commits after this read.
    upto = receipts.stat().st_size if receipts.exists() else 0
    for values in scan_rows(db, ROW_COLUMNS, scan):
        row = Row(*values)
        top = row.seq
        if not row.verify():
            damaged_rows.append(row.seq)
            continue
        s = sessions.setdefault(row.sid, SessionCheck(row.sid))
        if row.sess_seq != s._next:
            s.bad(s._next, f"event #{s._next} is missing or damaged")
        s._next = row.sess_seq + 1
        s.events += 1
        kind = parse_kind(JournalEvent, row.kind, "journal event", JournalError)
        s.turns += kind is JournalEvent.TURN
        if kind is JournalEvent.LOST:
            lost = int(row.data().get("events", 0))
            s.lost_before += max(lost, 0)
        if kind in END_STATES:
            s.state = END_STATES[kind]
    for first, last in scan.unreadable:
        damaged_rows.extend(range(first, last + 1))
    _attribute(path, damaged_rows, report)
    for s in sessions.values():
        if s.expected and s._next <= s.expected:
            s.bad(s._next, f"events #{s._next}-#{s.expected} are missing")
    # Events committed past the file's end: their WAL tail was lost.
    for sid, events in lost_events(receipts, top, upto).items():
        s = sessions.setdefault(sid, SessionCheck(sid))
        first = min(n for n, _ in events)
        s.bad(first, f"{len(events)} events past the file's end (the WAL tail was lost)")
    try:
        for data, crc in db.execute("SELECT data, crc FROM blobs"):
            report.bad_blobs += zlib.crc32(data) != crc
    except sqlite3.DatabaseError:
        report.bad_blobs += 1
    if report.version > 2:  # Schema 2 has no `images`.
        try:
            for data, crc in db.execute("SELECT data, crc FROM images"):
                report.bad_images += zlib.crc32(data) != crc
        except sqlite3.DatabaseError:
            report.bad_images += 1


def _attribute(path: Path, seqs: list[int], report: CheckReport) -> None:
    """Tie damaged rows to their sessions through the receipts, where they name them."""
    wanted = set(seqs)
    receipts = receipts_path(path)
    found = 0
    if wanted and receipts.exists():
        with open(receipts, "rb") as f:
            for line in f:
                parsed = parse_line(line)
                if parsed is None or parsed[0] not in wanted:
                    continue
                seq, sess_seq, kind, sid = parsed
                s = report.sessions.setdefault(sid, SessionCheck(sid))
                s.bad(sess_seq, f"event #{sess_seq} ({kind}, row {seq}) is damaged")
                found += 1
    report.unattributed = len(wanted) - found
