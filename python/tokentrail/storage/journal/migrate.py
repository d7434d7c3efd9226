"""Migrating an older journal to the current schema when a server opens it to append.

Schema 1: every session is written again through a current `Journal` (its settings, its served
turns, its end), the schema-1 file is moved aside (never deleted), and the new file takes its
place. Turns from schema 1 carry no recorded reply, so a retry of one of them is generated
again. The new journal is made by the caller (`open_journal`), so this module does not import
the writer that opens files through it.

Schema 2: its events are read as they are (turns whose tags carry their images' bytes), so
the file is kept and only given the `images` table later turns store their images in.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from tokentrail.errors import JournalError
from tokentrail.kinds import JournalState
from tokentrail.storage.journal.format import IMAGES_TABLE, SCHEMA_VERSION
from tokentrail.storage.journal.record import JournaledTurn
from tokentrail.storage.journal.v1 import read_v1

logger = logging.getLogger(__name__)


class MigrationTarget(Protocol):
    """What migrating writes to: the events of a schema-2 journal (`writer.Journal`)."""

    def set_meta(self, **values: str) -> None: ...

    def session_opened(self, sid: str, settings: dict[str, Any]) -> None: ...

    def turn(self, turn: JournaledTurn) -> int: ...

    def lost(self, sid: str, first: int, events: int, reason: str) -> None: ...

    def session_finished(self, sid: str, reward: float, metadata: dict[str, Any]) -> None: ...

    def session_dropped(self, sid: str) -> None: ...

    def close(self) -> None: ...


def migrate_v1(path: Path, open_journal: Callable[[Path], MigrationTarget]) -> Path:
    """Rewrite the schema-1 journal at `path` as schema 2 through a journal `open_journal`
    opens; returns where the old file went."""
    meta, records = read_v1(path)
    fresh = path.with_name(f"{path.name}.schema2")
    for suffix in ("", "-wal", "-shm", "-receipts", "-lock"):
        Path(f"{fresh}{suffix}").unlink(missing_ok=True)
    journal = open_journal(fresh)
    try:
        journal.set_meta(**{k: v for k, v in meta.items() if k != "schema_version"})
        for record in records:
            if record.settings is not None:
                journal.session_opened(record.sid, record.settings)
            for turn in record.turns:
                journal.turn(turn)
            if record.damage is not None:
                journal.lost(record.sid, len(record.turns) + 1, -1, record.damage)
            if record.state == JournalState.FINISHED:
                journal.session_finished(record.sid, record.reward, record.metadata)
            elif record.state == JournalState.DROPPED:
                journal.session_dropped(record.sid)
    finally:
        journal.close()
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside = path.with_name(f"{path.name}.schema1-{stamp}-{os.getpid()}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{path}{suffix}")
        if src.exists():
            shutil.move(src, Path(f"{aside}{suffix}"))
    os.replace(fresh, path)
    os.replace(Path(f"{fresh}-receipts"), Path(f"{path}-receipts"))
    Path(f"{fresh}-lock").unlink(missing_ok=True)
    logger.info(
        "journal %s: migrated from schema 1 (%d sessions); the schema-1 file is kept at %s",
        path,
        len(records),
        aside,
    )
    return aside


def upgrade_v2(path: Path) -> None:
    """Make the schema-2 journal at `path` current in place: the `images` table and the
    version, in one transaction (a crash leaves it schema 2, upgraded at the next open)."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute(IMAGES_TABLE)
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
        db.execute("COMMIT")
    except sqlite3.Error as exc:
        raise JournalError(f"journal {path}: cannot upgrade it from schema 2 ({exc})") from None
    finally:
        db.close()
    logger.info("journal %s: upgraded from schema 2 in place", path)
