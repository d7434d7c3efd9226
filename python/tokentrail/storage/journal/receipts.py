"""Receipts: one line per committed event, outside the database, to know what a WAL lost.

SQLite drops a damaged or cut WAL tail without a word: the file then simply ends earlier. The
writer appends `seq sess_seq kind sid` to `FILE-receipts` after every commit (a plain write
that, like the commit, survives a killed process), so on the next open every event the receipts
name past the file's last one is known lost, with its session. Lines are in `seq` order.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from pathlib import Path

logger = logging.getLogger(__name__)

# How much of the file's end is read at a time when looking for the first lost line.
CHUNK = 1 << 16


def receipts_path(path: Path) -> Path:
    return Path(f"{path}-receipts")


class Receipts:
    """The receipts file of one journal, appended to by its writer."""

    def __init__(self, journal: Path) -> None:
        self.path = receipts_path(journal)
        self._fd: int | None = None
        self._failed = False

    def open(self) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, seq: int, sess_seq: int, kind: str, sid: str) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, receipt_line(seq, sess_seq, kind, sid))
        except OSError as exc:
            # The event is committed; only the check for a lost WAL tail is weaker.
            if not self._failed:
                logger.warning("journal receipts %s cannot be written (%s)", self.path, exc)
            self._failed = True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def cut_after(self, top: int) -> None:
        """Drop the lines of events past `top` (the ones the file lost)."""
        offset = _first_line_after(self.path, top)
        if offset is not None:
            os.truncate(self.path, offset)


def receipt_line(seq: int, sess_seq: int, kind: str, sid: str) -> bytes:
    return f"{seq} {sess_seq} {kind} {json.dumps(sid)}\n".encode()


def parse_line(line: bytes) -> tuple[int, int, str, str] | None:
    """(seq, sess_seq, kind, sid), or None for a line cut short or garbled."""
    try:
        seq, sess_seq, kind, sid = line.decode().rstrip("\n").split(" ", 3)
        return int(seq), int(sess_seq), kind, str(json.loads(sid))
    except (ValueError, UnicodeDecodeError):
        return None


def _first_line_after(path: Path, top: int, upto: int | None = None) -> int | None:
    """The byte offset of the first line whose seq is past `top`, or of a torn or garbled
    line (None: every line is at or before `top`), in the first `upto` bytes (all when None).
    Reads only as much of the end as needed."""
    if not path.exists():
        return None
    size = path.stat().st_size if upto is None else min(upto, path.stat().st_size)
    span = CHUNK
    with open(path, "rb") as f:
        while True:
            start = max(0, size - span)
            f.seek(start)
            block = f.read(size - start)
            pos = 0
            if start > 0:
                # Skip the line the block starts inside of; widen until the block begins at
                # or before `top`.
                pos = block.find(b"\n") + 1
                nxt = block.find(b"\n", pos)
                parsed = parse_line(block[pos : nxt + 1]) if pos and nxt >= 0 else None
                if parsed is None or parsed[0] > top:
                    span *= 2
                    continue
            while pos < len(block):
                nl = block.find(b"\n", pos)
                parsed = parse_line(block[pos : nl + 1]) if nl >= 0 else None
                if parsed is None or parsed[0] > top:
                    return start + pos
                pos = nl + 1
            return None


def lost_events(path: Path, top: int, upto: int | None = None) -> dict[str, list[tuple[int, str]]]:
    """Per session, (sess_seq, kind) of every event the receipts name past `top`, in their
    first `upto` bytes (all when None: a reader of a journal being written passes the size
    the receipts had before it read the file, so events committed since are not taken for
    lost)."""
    offset = _first_line_after(path, top, upto)
    lost: dict[str, list[tuple[int, str]]] = {}
    if offset is None:
        return lost
    with open(path, "rb") as f:
        f.seek(offset)
        end = path.stat().st_size if upto is None else upto
        for line in f.read(end - offset).splitlines(keepends=True):
            parsed = parse_line(line)
            if parsed is not None and parsed[0] > top:
                lost.setdefault(parsed[3], []).append((parsed[1], parsed[2]))
    return lost


def write_all(path: Path, db: sqlite3.Connection) -> None:
    """Receipts for every event of `db` (after a rebuild or a compaction)."""
    tmp = path.with_name(f"{path.name}.tmp")
    with open(tmp, "wb") as f:
        for seq, sess_seq, kind, sid in db.execute(
            "SELECT seq, sess_seq, kind, sid FROM events ORDER BY seq"
        ):
            f.write(receipt_line(seq, sess_seq, kind, sid))
    os.replace(tmp, path)


def session_kinds(path: Path) -> dict[str, dict[int, str]]:
    """Per session, the kind of each event the receipts name, by its session sequence number
    (the latest line wins: a rebuilt journal numbers again from where a session was cut)."""
    kinds: dict[str, dict[int, str]] = {}
    if not path.exists():
        return kinds
    with open(path, "rb") as f:
        for line in f:
            parsed = parse_line(line)
            if parsed is not None:
                kinds.setdefault(parsed[3], {})[parsed[1]] = parsed[2]
    return kinds
