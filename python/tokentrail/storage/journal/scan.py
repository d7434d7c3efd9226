"""Reading every row of a possibly damaged journal file, keeping what is readable.

SQLite refuses a query that touches a damaged page ("database disk image is malformed"), so a
scan in order of `seq` steps over such a page row by row and goes on after it: every readable
row is kept, and the numbers it could not read are reported as ranges. A file cut short (its
header counts pages that are not there) is read through a copy whose header admits the pages
that exist.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BATCH = 256
# Without a known last number, a probe gives up after this many unreadable numbers in a row.
PROBE_LIMIT = 4096
SQLITE_MAGIC = b"SQLite format 3\x00"


def open_ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)


@dataclass
class Scan:
    """What a scan could not read: seq ranges (inclusive), and the first SQLite error."""

    unreadable: list[tuple[int, int]] = field(default_factory=list)
    error: str | None = None

    def note(self, first: int, last: int, exc: Exception) -> None:
        if self.unreadable and self.unreadable[-1][1] == first - 1:
            self.unreadable[-1] = (self.unreadable[-1][0], last)
        else:
            self.unreadable.append((first, last))
        self.error = self.error or str(exc)

    @property
    def lost(self) -> int:
        return sum(b - a + 1 for a, b in self.unreadable)


def last_seq(db: sqlite3.Connection) -> int | None:
    """The highest event number the file knows of (AUTOINCREMENT keeps it in its own table)."""
    for sql in (
        "SELECT seq FROM sqlite_sequence WHERE name = 'events'",
        "SELECT max(seq) FROM events",
    ):
        try:
            row = db.execute(sql).fetchone()
        except sqlite3.DatabaseError:
            continue
        if row is not None and row[0] is not None:
            return int(row[0])
    return None


def scan_rows(
    db: sqlite3.Connection, columns: str, scan: Scan, *, upto: int | None = None
) -> Iterator[tuple[Any, ...]]:
    """Every readable row of `events` in order of `seq` (the first column must be `seq`)."""
    top = upto if upto is not None else last_seq(db)
    last = 0
    while True:
        try:
            batch = db.execute(
                f"SELECT {columns} FROM events WHERE seq > ? ORDER BY seq LIMIT {BATCH}", (last,)
            ).fetchall()
        except sqlite3.DatabaseError as exc:
            found = _probe(db, columns, last, top, scan, exc)
            if found is None:
                return
            last = found[0]
            yield found
            continue
        if not batch:
            if top is not None and last < top:
                # Rows past the last readable one were on pages the b-tree no longer reaches.
                scan.note(last + 1, top, sqlite3.DatabaseError("rows missing at the end"))
            return
        yield from batch
        last = batch[-1][0]


def _probe(
    db: sqlite3.Connection,
    columns: str,
    last: int,
    top: int | None,
    scan: Scan,
    exc: Exception,
) -> tuple[Any, ...] | None:
    """The next readable row after `last`, looked up one number at a time."""
    seq, misses = last + 1, 0
    while (top is None and misses < PROBE_LIMIT) or (top is not None and seq <= top):
        try:
            row = db.execute(f"SELECT {columns} FROM events WHERE seq = ?", (seq,)).fetchone()
        except sqlite3.DatabaseError as err:
            row, exc = None, err
        if row is not None:
            if seq > last + 1:
                scan.note(last + 1, seq - 1, exc)
            return tuple(row)
        seq, misses = seq + 1, misses + 1
    if top is not None and top > last:
        scan.note(last + 1, top, exc)
    return None


def salvage_copy(path: Path) -> Path:
    """A copy of a truncated database whose header counts only the pages that exist."""
    data = bytearray(path.read_bytes())
    copy = path.with_name(f"{path.name}.salvage")
    if len(data) >= 100 and data[:16] == SQLITE_MAGIC:
        page = int.from_bytes(data[16:18], "big")
        page = 65536 if page == 1 else page
        pages = len(data) // page
        data = data[: pages * page]
        data[28:32] = pages.to_bytes(4, "big")
    copy.write_bytes(bytes(data))
    wal = Path(f"{path}-wal")
    if wal.exists():
        Path(f"{copy}-wal").write_bytes(wal.read_bytes())
    return copy


def remove_copy(copy: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{copy}{suffix}").unlink(missing_ok=True)


@contextmanager
def readable(path: Path) -> Iterator[tuple[sqlite3.Connection, str | None]]:
    """A read-only connection to `path`, or to a salvage copy when SQLite refuses the file;
    with the reason the file itself was refused (None when it was not)."""
    refused: str | None = None
    db = open_ro(path)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        refused = f"cannot open: {exc}"
        db.close()
    if refused is None:
        try:
            yield db, None
        finally:
            db.close()
        return
    copy = salvage_copy(path)
    try:
        db = open_ro(copy)
        try:
            yield db, refused
        finally:
            db.close()
    finally:
        remove_copy(copy)
