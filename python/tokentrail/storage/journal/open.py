"""Opening a journal file to append: what is done to it before the first new event.

A schema-1 file is migrated, a schema-2 one given the `images` table; a file SQLite refuses,
or whose session index is damaged, is rebuilt from its intact events; events the receipts name
past the file's end (a lost WAL tail) are found, and the WAL and receipts as they were are
copied aside before new commits go on.
What was found is kept in a `Recovery`, which the journal reports and its owner can read.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tokentrail.errors import JournalError
from tokentrail.kinds import JournalState
from tokentrail.storage.journal.format import SAME_EVENTS, SCHEMA, SCHEMA_VERSION, session_crc
from tokentrail.storage.journal.migrate import MigrationTarget, migrate_v1, upgrade_v2
from tokentrail.storage.journal.rebuild import rebuild
from tokentrail.storage.journal.receipts import Receipts, lost_events
from tokentrail.storage.journal.session import SessionDamage
from tokentrail.storage.journal.v1 import schema_version

logger = logging.getLogger(__name__)

# Per session, (session sequence number, kind) of each event the file lost.
Lost = dict[str, list[tuple[int, str]]]


@dataclass
class Recovery:
    """What opening a journal found: per session, what could not be recovered."""

    damaged: list[SessionDamage] = field(default_factory=list)
    # Where damaged or replaced files were kept, and the schema a journal was migrated from.
    moved_to: list[Path] = field(default_factory=list)
    migrated_from: int | None = None
    # The unfinished sessions, in order of their first event.
    live: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.damaged

    def describe(self) -> list[str]:
        return [d.describe() for d in self.damaged]

    def rebuild(self, path: Path, reason: str, keep: dict[str, int] | None = None) -> None:
        """Replace the file by one holding every intact event (see `rebuild`)."""
        result = rebuild(path, keep or {}, reason)
        self.damaged.extend(result.damaged)
        if result.moved_to is not None:
            self.moved_to.append(result.moved_to)
        logger.warning(
            "journal %s is damaged (%s): kept every intact event; the damaged file is kept at %s",
            path,
            reason,
            result.moved_to,
        )
        for damage in result.damaged:
            logger.warning("journal %s: %s", path, damage.describe())


@dataclass
class SessionState:
    """One session as the index has it."""

    state: str
    last: int  # its last session sequence number
    first: int  # the global seq of its first event


def prepare(
    path: Path,
    receipts: Receipts,
    recovery: Recovery,
    open_journal: Callable[[Path], MigrationTarget],
) -> Lost:
    """Make `path` a current-schema file to append to; returns the events it lost, by session.
    A schema-1 file is migrated into a journal `open_journal` opens."""
    if not path.exists():
        _set_aside_orphaned(path, receipts)
        return {}
    try:
        version, top = probe(path)
    except sqlite3.DatabaseError as exc:
        recovery.rebuild(path, f"cannot open: {exc}")
        version, top = probe(path)
    if version == 1:
        recovery.moved_to.append(migrate_v1(path, open_journal))
        recovery.migrated_from = 1
        version, top = probe(path)
    if version not in (0, *SAME_EVENTS):
        raise JournalError(
            f"journal {path} has schema {version}; this tokentrail reads schemas 1 to "
            f"{SCHEMA_VERSION}"
        )
    lost = lost_events(receipts.path, top)
    if lost:
        # Keep what the WAL still holds before new commits overwrite it.
        recovery.moved_to.append(keep_aside(path, "-wal", "lost"))
        recovery.moved_to.append(keep_aside(path, "-receipts", "lost"))
        receipts.cut_after(top)
    if version == 2:
        # After the lost tail is kept aside: the upgrade is a commit of its own.
        upgrade_v2(path)
        recovery.migrated_from = 2
    return lost


def _set_aside_orphaned(path: Path, receipts: Receipts) -> None:
    """Receipts whose journal file is gone (deleted, or a lost disk that kept them) name events
    of a file that no longer exists: moved aside, so the new file's numbers start afresh and
    are never taken for events of the old one."""
    if not receipts.path.exists() or not receipts.path.stat().st_size:
        return
    named = lost_events(receipts.path, 0)
    aside = Path(f"{receipts.path}.orphaned-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    os.replace(receipts.path, aside)
    logger.warning(
        "journal %s is missing, but its receipts name %d events of %d sessions: those sessions "
        "are not recovered (the receipts are kept at %s)",
        path,
        sum(len(events) for events in named.values()),
        len(named),
        aside,
    )


def connect(path: Path, sync: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={sync.upper()}")
    for statement in SCHEMA:
        db.execute(statement)
    db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    return db


def load_live(db: sqlite3.Connection) -> dict[str, SessionState]:
    """The unfinished sessions, in order of their first event; every index entry is checked
    (a `JournalError` when one fails its checksum)."""
    live = {}
    for sid, state, last, first, crc in db.execute(
        "SELECT sid, state, last, first, crc FROM sessions ORDER BY first"
    ):
        if session_crc(sid, state, last, first) != crc:
            raise JournalError(f"session {sid!r}: its index entry fails its checksum")
        if state == JournalState.LIVE:
            live[sid] = SessionState(state, last, first)
    return live


def probe(path: Path) -> tuple[int, int]:
    """A file's schema version and highest event number, read without changing it."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        version = schema_version(db)
        top = 0
        if version:
            (top,) = db.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()
        return version, int(top)
    finally:
        db.close()


def keep_aside(path: Path, suffix: str, why: str) -> Path:
    """Copy `path + suffix` aside (when it exists) under a stamped name; returns that name."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    src = Path(f"{path}{suffix}")
    dst = Path(f"{path}{suffix}.{why}-{stamp}-{os.getpid()}")
    if src.exists():
        shutil.copyfile(src, dst)
    return dst
