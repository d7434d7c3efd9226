"""Pruning finished sessions out of a journal, and exporting them to sample files first.

A journal only needs its unfinished sessions to recover; finished and dropped ones are history.
`export_finished` linearizes every finished session exactly as recorded and writes its samples
(.npz/.jsonl/.parquet); `compact` (which takes the journal's writer lock, so not while a server
holds it) rewrites the file without finished and dropped sessions, checking every event it
keeps on the way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tokentrail.errors import JournalError
from tokentrail.kinds import JournalState
from tokentrail.storage.export import write_samples
from tokentrail.storage.journal.format import SAME_EVENTS
from tokentrail.storage.journal.lock import JournalLock
from tokentrail.storage.journal.read import read_journal
from tokentrail.storage.journal.rebuild import rebuild
from tokentrail.storage.journal.session import SessionDamage
from tokentrail.storage.replay import Settings, linearize_record
from tokentrail.trajectory.lost import describe

logger = logging.getLogger(__name__)


@dataclass
class Exported:
    sessions: int
    samples: int
    damaged: list[str]


def export_finished(path: str | Path, out: str | Path) -> Exported:
    """Write the samples of every finished session, linearized as recorded, to `out`."""
    contents = read_journal(path)
    pipeline_settings = Settings.recorded(contents.meta)
    samples, sessions, damaged = [], 0, []
    for record in contents.records():
        if record.state != JournalState.FINISHED:
            continue
        spans = record.losses()
        if spans:
            # Damage found now, or turns lost at an earlier start: its samples are not whole
            # (their metadata says so).
            damaged.append(record.damage or describe(record.sid, spans))
        trajectory = linearize_record(record, pipeline_settings.pipeline(None))
        samples.extend(trajectory.samples)
        sessions += 1
    write_samples(out, samples)
    return Exported(sessions, len(samples), damaged)


@dataclass
class Compacted:
    bytes_before: int
    bytes_after: int
    sessions_removed: int
    events_removed: int
    damaged: list[SessionDamage]
    exported: Exported | None = None


def _size(path: Path) -> int:
    return sum(
        Path(f"{path}{s}").stat().st_size
        for s in ("", "-wal", "-receipts")
        if Path(f"{path}{s}").exists()
    )


def compact(path: str | Path, *, export_to: str | Path | None = None) -> Compacted:
    """Remove finished and dropped sessions from the journal (after exporting the finished
    ones' samples to `export_to`, if given). Fails fast while another process holds it."""
    path = Path(path)
    lock = JournalLock(path)
    lock.acquire()
    try:
        contents = read_journal(path)
        if contents.version not in SAME_EVENTS:
            raise JournalError(
                f"journal {path} has schema {contents.version}: open it once with "
                "`tokentrail serve --journal` (or `Journal(path)`) to migrate it, then compact"
            )
        exported = export_finished(path, export_to) if export_to is not None else None
        states = contents.states()
        done = frozenset(
            sid
            for sid, state in states.items()
            if state in (JournalState.FINISHED, JournalState.DROPPED)
        )
        before = _size(path)
        result = rebuild(path, {}, "compaction", drop=done, keep_old=False)
        for damage in result.damaged:
            logger.warning("journal %s: %s", path, damage.describe())
        return Compacted(
            before,
            _size(path),
            result.removed_sessions,
            result.removed_events,
            result.damaged,
            exported,
        )
    finally:
        lock.release()
