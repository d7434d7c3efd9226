"""Reading journals of schema 1, as the releases before schema 2 wrote them.

Schema 1 stored every turn's translated messages and tools in full, its prompt ids as the tail
past the session's previous turn (named by its global `seq`), and retracted a turn whose reply
never reached the client with a later `retract` event. Such a journal is read whole (they are
small); opening one to serve migrates it to the current schema (`journal.Journal`).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import sqlite3
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from tokentrail.core.ids import LogprobArray, TokenArray
from tokentrail.errors import JournalError
from tokentrail.kinds import Fallback, History, JournalEvent, JournalState, parse_kind
from tokentrail.storage.journal.format import END_STATES
from tokentrail.storage.journal.record import JournaledTurn
from tokentrail.storage.journal.scan import Scan, readable, scan_rows
from tokentrail.storage.journal.session import SessionRecord
from tokentrail.trajectory.ledger import parse_history_label

logger = logging.getLogger(__name__)


def _ids(text: str) -> TokenArray:
    return np.frombuffer(base64.b64decode(text), dtype="<u4").astype(np.uint32)


def _lps(text: str | None) -> LogprobArray | None:
    if text is None:
        return None
    return np.frombuffer(base64.b64decode(text), dtype="<f4").astype(np.float32)


def schema_version(db: sqlite3.Connection) -> int:
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.DatabaseError:
        return 0
    return int(row[0]) if row is not None else 0


def read_v1(path: Path) -> tuple[dict[str, str], list[SessionRecord]]:
    """Every session of a schema-1 journal, in order of first event, and its settings.

    A session whose events cannot all be read or decoded keeps the turns before the first one
    that cannot, and says so in its `damage`.
    """
    with readable(path) as (db, refused):
        try:
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError:
            meta = {}
        scan = Scan()
        rows = list(scan_rows(db, "seq, sid, kind, payload, crc", scan))
    sessions: dict[str, SessionRecord] = {}
    held: dict[str, tuple[int, TokenArray]] = {}
    turns: dict[int, JournaledTurn] = {}
    retracted: set[int] = set()
    for seq, sid, kind, payload, crc in rows:
        record = sessions.setdefault(sid, SessionRecord(sid, JournalState.LIVE))
        if record.damage is not None:
            continue
        if zlib.crc32(payload) != crc:
            record.damage = f"event {seq}: checksum mismatch"
            continue
        try:
            data = json.loads(payload)
            _apply(record, kind, data, seq, held, turns, retracted)
        except (ValueError, KeyError, TypeError) as exc:
            record.damage = f"event {seq}: unreadable ({exc})"
    for record in sessions.values():
        kept = (t for t in record.turns if t.seq not in retracted)
        record.turns = [dataclasses.replace(t, seq=i) for i, t in enumerate(kept, 1)]
    problems = [r for r in sessions.values() if r.damage]
    if refused or scan.unreadable or problems:
        logger.warning(
            "journal %s (schema 1): %s; %d sessions affected",
            path,
            refused or scan.error or problems[0].damage,
            len(problems),
        )
    return meta, list(sessions.values())


def _apply(
    record: SessionRecord,
    kind: str,
    data: dict[str, Any],
    seq: int,
    held: dict[str, tuple[int, TokenArray]],
    turns: dict[int, JournaledTurn],
    retracted: set[int],
) -> None:
    sid = record.sid
    if kind == JournalEvent.OPEN:
        record.settings = data
        record.state = JournalState.LIVE
    elif kind == JournalEvent.TURN:
        tail = _ids(data["tail"])
        if data["base"]:
            base_seq, tokens = held.get(sid, (0, np.empty(0, np.uint32)))
            if base_seq != data["base"]:
                raise KeyError(f"its base {data['base']} is not the session's last turn")
            prompt = np.concatenate([tokens[: data["prefix"]], tail])
        else:
            prompt = tail
        output = _ids(data["output"])
        held[sid] = (seq, np.concatenate([prompt, output]))
        turn = _turn(sid, seq, data, prompt, output)
        turns[seq] = turn
        record.turns.append(turn)
    elif kind == JournalEvent.RETRACT:
        retracted.add(int(data["seq"]))
    elif kind in END_STATES:
        record.state = END_STATES[parse_kind(JournalEvent, kind, "journal event", JournalError)]
        held.pop(sid, None)
        if record.state == JournalState.FINISHED:
            record.reward = float(data.get("reward", 0.0))
            record.metadata = dict(data.get("metadata") or {})


def _turn(
    sid: str, seq: int, d: dict[str, Any], prompt: TokenArray, output: TokenArray
) -> JournaledTurn:
    if "history" in d:
        history = (
            None if d["history"] is None else parse_kind(History, d["history"], "history mode")
        )
        fallback = (
            None if d.get("fallback") is None else parse_kind(Fallback, d["fallback"], "fallback")
        )
    else:
        # The first schema-1 journals kept only the ledger's label, in the turn's metadata.
        history, fallback = parse_history_label(d["metadata"].get("history"))
    return JournaledTurn(
        sid=sid,
        seq=seq,
        translated=d["translated"],
        response_message=d["response_message"],
        tools=d["tools"],
        prompt_ids=prompt,
        output_ids=output,
        logprobs=_lps(d["logprobs"]),
        finish_reason=d["finish_reason"],
        ill_formed=d["ill_formed"],
        metadata=d["metadata"],
        history=history,
        fallback=fallback,
    )
