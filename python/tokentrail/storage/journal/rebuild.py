"""Rebuilding a damaged journal file from every event that is still intact.

Every readable row is checked (its CRC, and that it is its session's next number); a session
keeps its events up to its first missing or damaged one, then gets a `lost` event saying what
is missing, and its end (finished, dropped) if its index or its receipts say it had ended.
Rows are copied unchanged into a fresh file, which takes the damaged file's place; the damaged
file is moved aside, never deleted. Where the receipts name the event a damaged row held, the
loss is reported against its session.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tokentrail.errors import JournalError
from tokentrail.kinds import JournalEvent, JournalState, parse_kind
from tokentrail.storage.journal.format import (
    END_STATES,
    ROW_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    Row,
    dump,
    event_crc,
    session_crc,
)
from tokentrail.storage.journal.images import named_images
from tokentrail.storage.journal.receipts import (
    parse_line,
    receipts_path,
    session_kinds,
    write_all,
)
from tokentrail.storage.journal.scan import Scan, readable, scan_rows
from tokentrail.storage.journal.session import SessionDamage

logger = logging.getLogger(__name__)


@dataclass
class RebuildResult:
    moved_to: Path | None
    damaged: list[SessionDamage] = field(default_factory=list)
    removed_sessions: int = 0
    removed_events: int = 0


@dataclass
class _Kept:
    """What the new file holds of one session so far."""

    first: int
    last: int = 0
    state: str = JournalState.LIVE
    cut: str | None = None  # why its later events are not kept
    cut_at: int = 0  # its first event not kept
    dropped_rows: int = 0
    dropped_turns: int = 0  # of those, generated turns
    ended: str | None = None  # an intact finish or drop after the cut


def rebuild(
    path: Path,
    keep: dict[str, int],
    reason: str,
    *,
    drop: frozenset[str] = frozenset(),
    keep_old: bool = True,
) -> RebuildResult:
    """Rebuild `path` in place; `keep` cuts the named sessions after that many events (damage
    a caller found and reports itself); `drop` leaves the named sessions out (compaction),
    and then the tool lists and images only they used. The old file is moved aside unless
    `keep_old` is False (compaction), then it is removed."""
    logger.debug("journal %s: rebuilding (%s)", path, reason)
    fresh = path.with_name(f"{path.name}.rebuild")
    for suffix in ("", "-wal", "-shm", "-receipts"):
        Path(f"{fresh}{suffix}").unlink(missing_ok=True)
    out = sqlite3.connect(fresh, isolation_level=None)
    for statement in SCHEMA:
        out.execute(statement)
    out.execute("BEGIN")
    with readable(path) as (db, _refused):
        _copy_meta(db, out)
        index = {sid: v for sid, v in _index(db).items() if sid not in drop}
        copied = _copy_events(db, out, keep, index, drop)
        _copy_blobs(db, out, copied.refs if drop else None)
        _copy_images(db, out, copied.images if drop else None)
    damaged = _settle(path, out, copied.kept, copied.unattributed, index, keep)
    out.execute("COMMIT")
    write_all(Path(f"{fresh}-receipts"), out)
    out.close()
    moved = _swap(path, fresh, keep_old)
    return RebuildResult(moved, damaged, copied.removed_sessions, copied.removed_events)


@dataclass
class _Copied:
    kept: dict[str, _Kept] = field(default_factory=dict)
    unattributed: list[int] = field(default_factory=list)
    refs: set[str] = field(default_factory=set)  # tool lists the kept turns name
    images: set[str] = field(default_factory=set)  # images the kept turns name
    removed_sessions: int = 0
    removed_events: int = 0


def _copy_meta(db: sqlite3.Connection, out: sqlite3.Connection) -> None:
    try:
        meta = db.execute("SELECT key, value FROM meta").fetchall()
    except sqlite3.DatabaseError:
        meta = []
    out.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta)
    out.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))


def _index(db: sqlite3.Connection) -> dict[str, tuple[str, int]]:
    """What the session index says of each session (state, last number), where it is intact."""
    out: dict[str, tuple[str, int]] = {}
    try:
        for sid, state, last, first, crc in db.execute(
            "SELECT sid, state, last, first, crc FROM sessions"
        ):
            if session_crc(sid, state, last, first) == crc:
                out[sid] = (state, last)
    except sqlite3.DatabaseError:
        pass
    return out


def _copy_events(
    db: sqlite3.Connection,
    out: sqlite3.Connection,
    keep: dict[str, int],
    index: dict[str, tuple[str, int]],
    drop: frozenset[str],
) -> _Copied:
    scan = Scan()
    copied = _Copied()
    kept, unattributed = copied.kept, copied.unattributed
    removed: set[str] = set()
    for values in scan_rows(db, ROW_COLUMNS, scan):
        row = Row(*values)
        if not row.verify():
            unattributed.append(row.seq)
            continue
        if row.sid in drop:
            removed.add(row.sid)
            copied.removed_events += 1
            continue
        k = kept.get(row.sid)
        if k is None:
            k = kept[row.sid] = _Kept(first=row.seq)
        limit = keep.get(row.sid)
        if k.cut is None and limit is not None and row.sess_seq > limit:
            k.cut, k.cut_at = "reported by recovery", limit + 1
        elif k.cut is None and row.sess_seq != k.last + 1:
            k.cut, k.cut_at = f"event #{k.last + 1} is missing or damaged", k.last + 1
        if k.cut is not None:
            k.dropped_rows += 1
            k.dropped_turns += row.kind == JournalEvent.TURN
            if row.kind in END_STATES:
                k.ended = row.kind
            continue
        out.execute(f"INSERT INTO events ({ROW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)", values)
        if drop and row.kind == JournalEvent.TURN:
            data = row.data()
            ref = data.get("tools")
            if ref is not None:
                copied.refs.add(ref)
            copied.images.update(named_images(data.get("metadata") or {}))
        k.last = row.sess_seq
        if row.kind in END_STATES:
            k.state = END_STATES[parse_kind(JournalEvent, row.kind, "journal event", JournalError)]
        elif row.kind == JournalEvent.OPEN:
            k.state = JournalState.LIVE
    for first, last in scan.unreadable:
        unattributed.extend(range(first, last + 1))
    for sid, (state, last) in index.items():
        k = kept.get(sid)
        if k is None:
            kept[sid] = _Kept(first=0, state=state, cut="every event is missing", cut_at=1)
        elif k.cut is None and k.last < last:
            k.cut, k.cut_at = f"events #{k.last + 1}-#{last} are missing", k.last + 1
    copied.removed_sessions = len(removed)
    return copied


def _copy_blobs(db: sqlite3.Connection, out: sqlite3.Connection, refs: set[str] | None) -> None:
    """The intact tool lists (only those in `refs`, when given)."""
    try:
        rows = db.execute("SELECT hash, data, crc FROM blobs").fetchall()
    except sqlite3.DatabaseError:
        return
    out.executemany(
        "INSERT OR IGNORE INTO blobs VALUES (?, ?, ?)",
        [r for r in rows if zlib.crc32(r[1]) == r[2] and (refs is None or r[0] in refs)],
    )


def _copy_images(db: sqlite3.Connection, out: sqlite3.Connection, named: set[str] | None) -> None:
    """The intact images (only those in `named`, when given), one at a time: they are the
    bulk of a journal with images. A schema-2 file has none. Past an unreadable page the
    rest are not copied: a turn naming one of them then reads as damaged."""
    try:
        rows = db.execute("SELECT digest, media_type, data, crc FROM images")
    except sqlite3.DatabaseError:
        return
    while True:
        try:
            row = next(rows, None)
        except sqlite3.DatabaseError:
            return
        if row is None:
            return
        digest, _, data, crc = row
        if zlib.crc32(data) == crc and (named is None or digest in named):
            out.execute("INSERT OR IGNORE INTO images VALUES (?, ?, ?, ?)", row)


def _owners(path: Path, seqs: list[int]) -> dict[int, tuple[str, int, str]]:
    """(sid, sess_seq, kind) of the given events, from the receipts where they name them."""
    wanted, found = set(seqs), {}
    receipts = receipts_path(path)
    if not wanted or not receipts.exists():
        return {}
    with open(receipts, "rb") as f:
        for line in f:
            parsed = parse_line(line)
            if parsed is not None and parsed[0] in wanted:
                found[parsed[0]] = (parsed[3], parsed[1], parsed[2])
    return found


def _settle(
    path: Path,
    out: sqlite3.Connection,
    kept: dict[str, _Kept],
    unattributed: list[int],
    index: dict[str, tuple[str, int]],
    keep: dict[str, int],
) -> list[SessionDamage]:
    """Close every cut session with a `lost` event; write the session index."""
    owners = _owners(path, unattributed)
    ends: dict[str, str] = {}
    for sid, _sess_seq, kind in owners.values():
        k = kept.setdefault(sid, _Kept(first=0, cut="every event is missing", cut_at=1))
        if k.cut is None:
            k.cut, k.cut_at = "an event is damaged", k.last + 1
        if kind in END_STATES:
            ends[sid] = kind
    unknown = len(unattributed) - len(owners)
    damaged = []
    kinds: dict[str, dict[int, str]] | None = None  # from the receipts, when a session was cut
    for sid, k in kept.items():
        if k.cut is not None:
            mine = [kind for o_sid, _, kind in owners.values() if o_sid == sid]
            lost_rows = k.dropped_rows + len(mine)
            expected = index.get(sid, (JournalState.LIVE, 0))[1]
            lost = max(lost_rows, expected - k.last) if expected or lost_rows else -1
            # Turns among the lost events: the receipts name them all, or the rows did.
            turns = k.dropped_turns + mine.count(JournalEvent.TURN) if lost == lost_rows else -1
            if kinds is None:
                kinds = session_kinds(receipts_path(path))
            damage = SessionDamage(sid, k.cut_at, lost, k.cut, turns).counted(kinds.get(sid, {}))
            if sid not in keep:
                damaged.append(damage)
            k.last += 1
            _insert(out, sid, k, JournalEvent.LOST, damage.span().to_dict())
            end = k.ended or ends.get(sid) or _end_of(index.get(sid, (JournalState.LIVE, 0))[0])
            if end is not None and k.state == JournalState.LIVE:
                k.last += 1
                _insert(out, sid, k, parse_kind(JournalEvent, end, "journal event"), {"lost": True})
                k.state = END_STATES[parse_kind(JournalEvent, end, "journal event")]
        out.execute(
            "INSERT INTO sessions VALUES (?, ?, ?, ?, ?)",
            (sid, k.state, k.last, k.first, session_crc(sid, k.state, k.last, k.first)),
        )
    if unknown > 0:
        logger.warning(
            "journal %s: %d damaged events could not be attributed to a session", path, unknown
        )
    return damaged


def _end_of(state: str) -> str | None:
    for kind, end in END_STATES.items():
        if end == state:
            return kind.value
    return None


def _insert(
    out: sqlite3.Connection, sid: str, k: _Kept, kind: JournalEvent, data: Mapping[str, object]
) -> None:
    payload = dump(data)
    cur = out.execute(
        "INSERT INTO events (sid, sess_seq, kind, payload, ids, crc) VALUES (?, ?, ?, ?, ?, ?)",
        (sid, k.last, str(kind), payload, b"", event_crc(sid, k.last, kind, payload, b"")),
    )
    if not k.first:
        k.first = int(cur.lastrowid or 0)


def _swap(path: Path, fresh: Path, keep_old: bool) -> Path | None:
    """Move the old files aside (or remove them) and the rebuilt ones into place; returns
    where the old file went."""
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    for suffix in ("", "-wal", "-shm", "-receipts"):
        src = Path(f"{path}{suffix}")
        if not src.exists():
            continue
        if keep_old:
            shutil.move(src, Path(f"{aside}{suffix}"))
        elif suffix:
            src.unlink()
    os.replace(fresh, path)
    os.replace(Path(f"{fresh}-receipts"), receipts_path(path))
    return aside if keep_old else None
