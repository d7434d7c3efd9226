"""A durable journal of every recorded turn, so a crashed rollout worker loses nothing it served.

SQLite in WAL mode, one row per event (session open, turn, finish, drop), each with a CRC32 of
its payload. A turn's prompt ids are stored as the common prefix with an earlier turn of the
session plus the new tail, so the journal grows with unique tokens, not turns x context.

A turn is journaled before its reply is sent, so a crash after the client got the reply cannot
lose it; a reply that never reaches the client is retracted by a later event.

Durability: `synchronous=NORMAL` (the default) makes every appended event survive a crash of the
process (SIGKILL included): a commit returns once the WAL write reached the OS. Only a power
loss or kernel crash can lose the last commits; `synchronous=FULL` also survives those, at the
cost of an fsync per event (see `benches/journal_durability.py` for the measured cost).

On open, every event is checked; at the first one that cannot be read (bad CRC, bad JSON, a
damaged page) the valid prefix is kept, the rest is reported, and the damaged file is moved
aside (never deleted) before a fresh journal holding the valid prefix takes its place.
"""

from __future__ import annotations

import base64
import json
import logging
import shutil
import sqlite3
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tokentrail.core.replay import ReplayRows, WeightSpan
from tokentrail.errors import JournalError
from tokentrail.kinds import Fallback, History, ReplayGap
from tokentrail.messages import Message, ToolSchema
from tokentrail.trajectory.ledger import parse_history_label

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
SYNC_MODES = ("normal", "full")
OPEN, TURN, RETRACT, FINISH, DROP = "open", "turn", "retract", "finish", "drop"


@dataclass
class Event:
    seq: int
    sid: str
    kind: str
    data: dict[str, Any]


@dataclass
class Recovery:
    """What opening a journal found: the readable events, and what was not readable."""

    events: list[Event] = field(default_factory=list)
    damaged_from: int | None = None  # seq of the first unreadable event
    discarded: int = 0  # events at or after it (counted where the file still allowed)
    moved_to: Path | None = None  # where the damaged file was kept
    reason: str | None = None

    @property
    def clean(self) -> bool:
        return self.reason is None

    def retracted(self) -> set[int]:
        """Turns whose reply never reached the client."""
        return {e.data["seq"] for e in self.events if e.kind == RETRACT}

    def unfinished_sessions(self) -> list[str]:
        """Sessions with turns or an open event and no finish or drop, in order of first event."""
        state: dict[str, bool] = {}
        for e in self.events:
            if e.kind in (FINISH, DROP):
                state[e.sid] = False
            elif e.kind in (OPEN, TURN):
                if e.kind == OPEN or e.sid not in state:
                    state[e.sid] = True
        return [sid for sid, live in state.items() if live]


def _ids_b64(ids: Any) -> str:
    return base64.b64encode(np.asarray(ids, dtype="<u4").tobytes()).decode("ascii")


def _ids_from_b64(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<u4").astype(np.uint32)


def _lps_b64(lps: Any) -> str | None:
    if lps is None or not len(lps):
        return None
    return base64.b64encode(np.asarray(lps, dtype="<f4").tobytes()).decode("ascii")


def _lps_from_b64(text: str | None) -> np.ndarray | None:
    if text is None:
        return None
    return np.frombuffer(base64.b64decode(text), dtype="<f4").astype(np.float32)


def _replay_json(rows: ReplayRows | None) -> dict[str, Any] | None:
    """A turn's replay rows for the journal: the gap, or the start and the rows in the
    smallest integer type that holds them, base64 of little-endian bytes."""
    if rows is None:
        return None
    if rows.rows is None:
        return {"gap": str(rows.gap or ReplayGap.ENGINE_RETURNED_NONE)}
    values = rows.rows
    dtype: np.dtype = np.dtype("<i4")
    if values.size == 0 or values.min() >= 0:
        top = int(values.max()) if values.size else 0
        dtype = np.dtype("<u1" if top < 2**8 else "<u2" if top < 2**16 else "<u4")
    data = base64.b64encode(values.astype(dtype).tobytes()).decode("ascii")
    return {"start": rows.start, "dtype": dtype.str, "shape": list(values.shape), "data": data}


def _replay_from_json(d: dict[str, Any] | None) -> ReplayRows | None:
    if d is None:
        return None
    if "gap" in d:
        return ReplayRows.missing(ReplayGap(d["gap"]))
    values = np.frombuffer(base64.b64decode(d["data"]), dtype=np.dtype(d["dtype"]))
    return ReplayRows(values.reshape(tuple(d["shape"])), int(d["start"]))


def _prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class Journal:
    """Append-only event journal; see the module docstring."""

    def __init__(self, path: str | Path, *, sync: str = "normal") -> None:
        if sync not in SYNC_MODES:
            raise JournalError(f"unknown journal sync mode {sync!r}; expected {SYNC_MODES}")
        self.path = Path(path)
        self.sync = sync
        self.recovery = self._recover()
        self._db = self._connect(self.path)
        # Per session: the last turn's full token sequence (prompt + output) and its seq, the
        # base the next turn's prompt is stored against.
        self._last: dict[str, tuple[int, np.ndarray]] = {}
        # Prompt ids of the recovered turns, decoded in order (a base is always the previous
        # turn of the same session); dropped by `release()` once replayed.
        self._decoded: dict[int, np.ndarray] = {}
        for event in self.recovery.events:
            if event.kind == TURN:
                self._decoded[event.seq] = self._remember(event.seq, event.sid, event.data)
            elif event.kind in (FINISH, DROP):
                self._forget(event.sid)

    # -- opening ------------------------------------------------------------------------------

    def _connect(self, path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={self.sync.upper()}")
        db.execute(
            "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
            "sid TEXT NOT NULL, kind TEXT NOT NULL, payload BLOB NOT NULL, crc INTEGER NOT NULL)"
        )
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute(
            "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )
        return db

    def _recover(self) -> Recovery:
        if not self.path.exists():
            return Recovery()
        recovery = _read_events(self.path)
        if recovery.reason is None:
            return recovery
        return self._set_aside(recovery, recovery.reason)

    def _set_aside(self, recovery: Recovery, reason: str) -> Recovery:
        """Move the damaged file aside and rebuild a fresh journal from the valid prefix."""
        recovery.reason = reason
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.damaged-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(f"{self.path}{suffix}")
            if src.exists():
                shutil.move(src, Path(f"{aside}{suffix}"))
        recovery.moved_to = aside
        db = self._connect(self.path)
        with db:
            for e in recovery.events:
                payload = json.dumps(e.data, separators=(",", ":")).encode()
                db.execute(
                    "INSERT INTO events (seq, sid, kind, payload, crc) VALUES (?, ?, ?, ?, ?)",
                    (e.seq, e.sid, e.kind, payload, zlib.crc32(payload)),
                )
        db.close()
        lost = "an unknown number of" if recovery.discarded < 0 else str(recovery.discarded)
        logger.warning(
            "journal %s is damaged (%s): kept %d valid events, %s events from seq %s on were "
            "not replayed; the damaged file is kept at %s",
            self.path,
            reason,
            len(recovery.events),
            lost,
            recovery.damaged_from,
            aside,
        )
        return recovery

    # -- writing ------------------------------------------------------------------------------

    def _append(self, sid: str, kind: str, data: dict[str, Any]) -> int:
        payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
        cur = self._db.execute(
            "INSERT INTO events (sid, kind, payload, crc) VALUES (?, ?, ?, ?)",
            (sid, kind, payload, zlib.crc32(payload)),
        )
        return int(cur.lastrowid or 0)

    def set_meta(self, **values: str) -> None:
        for key, value in values.items():
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def meta(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT key, value FROM meta").fetchall())

    def session_opened(self, sid: str, settings: dict[str, Any]) -> None:
        self._append(sid, OPEN, settings)

    def session_finished(self, sid: str, reward: float, metadata: dict[str, Any]) -> None:
        self._append(sid, FINISH, {"reward": reward, "metadata": metadata})
        self._forget(sid)

    def retract(self, sid: str, seq: int) -> None:
        """The reply of turn `seq` never reached the client: it was not recorded."""
        self._append(sid, RETRACT, {"seq": seq})

    def session_dropped(self, sid: str, details: dict[str, Any] | None = None) -> None:
        """The session is gone without samples; `details` say why (an eviction, say)."""
        self._append(sid, DROP, dict(details or {}))
        self._forget(sid)

    def turn(
        self,
        sid: str,
        *,
        translated: list[Message],
        prompt_messages: list[Message],
        response_message: Message | None,
        tools: list[ToolSchema] | None,
        prompt_ids: Any,
        output_ids: Any,
        logprobs: Any,
        finish_reason: str | None,
        ill_formed: bool,
        metadata: dict[str, Any],
        history: History | None = None,
        fallback: Fallback | None = None,
        routed_experts: ReplayRows | None = None,
        indexer_topk: ReplayRows | None = None,
        weight_versions: tuple[WeightSpan, ...] = (),
    ) -> int:
        prompt = np.asarray(prompt_ids, dtype=np.uint32)
        base_seq, prefix = 0, 0
        if sid in self._last:
            base_seq, held = self._last[sid]
            prefix = _prefix_len(held, prompt)
        data = {
            "translated": translated,
            "prompt_messages": prompt_messages,
            "response_message": response_message,
            "tools": tools,
            "base": base_seq,
            "prefix": prefix,
            "tail": _ids_b64(prompt[prefix:]),
            "output": _ids_b64(output_ids),
            "logprobs": _lps_b64(logprobs),
            "finish_reason": finish_reason,
            "ill_formed": ill_formed,
            "metadata": metadata,
            "history": None if history is None else history.value,
            "fallback": None if fallback is None else fallback.value,
            "routed_experts": _replay_json(routed_experts),
            "indexer_topk": _replay_json(indexer_topk),
            "weight_versions": [span.to_dict() for span in weight_versions],
        }
        seq = self._append(sid, TURN, data)
        self._remember(seq, sid, data)
        return seq

    def _remember(self, seq: int, sid: str, data: dict[str, Any]) -> np.ndarray:
        return _decode_prompt(self._last, seq, sid, data)

    def _forget(self, sid: str) -> None:
        self._last.pop(sid, None)

    def release(self) -> None:
        """Forget the decoded prompts of recovered turns once they have been replayed."""
        self._decoded.clear()

    def close(self) -> None:
        self._db.close()

    # -- reading ------------------------------------------------------------------------------

    def events(self) -> Iterator[Event]:
        return iter(self.recovery.events)


def _scan(path: Path) -> Recovery:
    """Read events in order up to the first one that cannot be read."""
    recovery = Recovery()
    last = 0
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.DatabaseError as exc:
        recovery.reason = f"cannot open: {exc}"
        return recovery
    try:
        while True:
            row = db.execute(
                "SELECT seq, sid, kind, payload, crc FROM events WHERE seq > ? "
                "ORDER BY seq LIMIT 1",
                (last,),
            ).fetchone()
            if row is None:
                break
            seq, sid, kind, payload, crc = row
            if zlib.crc32(payload) != crc:
                recovery.reason = f"event {seq}: checksum mismatch"
                break
            try:
                data = json.loads(payload)
            except ValueError as exc:
                recovery.reason = f"event {seq}: unreadable payload ({exc})"
                break
            recovery.events.append(Event(seq, sid, kind, data))
            last = seq
    except sqlite3.DatabaseError as exc:
        recovery.reason = f"after event {last}: {exc}"
    if recovery.reason is not None:
        recovery.damaged_from = last + 1
        try:
            recovery.discarded = db.execute(
                "SELECT count(*) FROM events WHERE seq > ?", (last,)
            ).fetchone()[0]
        except sqlite3.DatabaseError:
            recovery.discarded = -1  # the damage hides how many
    db.close()
    return recovery


def _read_events(path: Path) -> Recovery:
    """The readable events of a journal, salvaging a truncated file when SQLite refuses it."""
    recovery = _scan(path)
    if recovery.reason is None or recovery.events:
        return recovery
    # SQLite refuses a file shorter than its header says (a truncated tail): read what is
    # left from a copy whose header admits the pages that are really there.
    salvage = _salvage_copy(path)
    try:
        salvaged = _scan(salvage)
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{salvage}{suffix}").unlink(missing_ok=True)
    if not salvaged.events:
        return recovery
    salvaged.reason = f"{recovery.reason}; {salvaged.reason or 'truncated'}"
    return salvaged


def _salvage_copy(path: Path) -> Path:
    """A copy of a truncated database whose header counts only the pages that exist."""
    data = bytearray(path.read_bytes())
    copy = path.with_name(f"{path.name}.salvage")
    if len(data) >= 100 and data[:16] == b"SQLite format 3\x00":
        page = int.from_bytes(data[16:18], "big")
        page = 65536 if page == 1 else page
        pages = len(data) // page
        data = data[: pages * page]
        data[28:32] = pages.to_bytes(4, "big")
    copy.write_bytes(bytes(data))
    return copy


@dataclass
class Contents:
    """A journal read without changing it: its settings, its readable events, the turns."""

    meta: dict[str, str]
    recovery: Recovery
    turns: dict[int, JournaledTurn]

    def sessions(self) -> list[str]:
        return list(dict.fromkeys(t.sid for t in self.turns.values()))

    def served_turns(self) -> list[JournaledTurn]:
        """Turns in order, without those whose reply never reached the client."""
        retracted = self.recovery.retracted()
        return [t for seq, t in self.turns.items() if seq not in retracted]


def read_journal(path: str | Path) -> Contents:
    """Read a journal (a damaged tail is reported, not repaired); for replay and audit."""
    path = Path(path)
    if not path.exists():
        raise JournalError(f"no journal at {path}")
    recovery = _read_events(path)
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        db.close()
    except sqlite3.DatabaseError:
        meta = {}
    if recovery.reason is not None:
        logger.warning(
            "journal %s: %s; reading the %d events before it",
            path,
            recovery.reason,
            len(recovery.events),
        )
    bases: dict[str, tuple[int, np.ndarray]] = {}
    turns: dict[int, JournaledTurn] = {}
    for event in recovery.events:
        if event.kind == TURN:
            prompt = _decode_prompt(bases, event.seq, event.sid, event.data)
            turns[event.seq] = _turn_of(event, prompt)
        elif event.kind in (FINISH, DROP):
            bases.pop(event.sid, None)
    return Contents(meta, recovery, turns)


def _decode_prompt(
    bases: dict[str, tuple[int, np.ndarray]], seq: int, sid: str, data: dict[str, Any]
) -> np.ndarray:
    """A turn's prompt ids from its stored tail and its session's previous turn."""
    tail = _ids_from_b64(data["tail"])
    if data["base"]:
        base_seq, held = bases.get(sid, (0, np.empty(0, np.uint32)))
        if base_seq != data["base"]:
            raise JournalError(f"event {seq}: its base {data['base']} is not {sid}'s last turn")
        prompt = np.concatenate([held[: data["prefix"]], tail])
    else:
        prompt = tail
    bases[sid] = (seq, np.concatenate([prompt, _ids_from_b64(data["output"])]))
    return prompt


@dataclass
class JournaledTurn:
    """One turn event, decoded."""

    sid: str
    translated: list[Message]
    prompt_messages: list[Message]
    response_message: Message | None
    tools: list[ToolSchema] | None
    prompt_ids: np.ndarray
    output_ids: np.ndarray
    logprobs: np.ndarray | None
    finish_reason: str | None
    ill_formed: bool
    metadata: dict[str, Any]
    history: History | None = None
    fallback: Fallback | None = None
    routed_experts: ReplayRows | None = None
    indexer_topk: ReplayRows | None = None
    weight_versions: tuple[WeightSpan, ...] = ()


def decode_turn(journal: Journal, event: Event) -> JournaledTurn:
    return _turn_of(event, journal._decoded[event.seq])


def _turn_of(event: Event, prompt_ids: np.ndarray) -> JournaledTurn:
    d = event.data
    if "history" in d:
        history = None if d["history"] is None else History(d["history"])
        fallback = None if d.get("fallback") is None else Fallback(d["fallback"])
    else:
        # Journals before schema 2 kept only the ledger's label, in the turn's metadata.
        history, fallback = parse_history_label(d["metadata"].get("history"))
    return JournaledTurn(
        sid=event.sid,
        translated=d["translated"],
        prompt_messages=d["prompt_messages"],
        response_message=d["response_message"],
        tools=d["tools"],
        prompt_ids=prompt_ids,
        output_ids=_ids_from_b64(d["output"]),
        logprobs=_lps_from_b64(d["logprobs"]),
        finish_reason=d["finish_reason"],
        ill_formed=d["ill_formed"],
        metadata=d["metadata"],
        history=history,
        fallback=fallback,
        routed_experts=_replay_from_json(d.get("routed_experts")),
        indexer_topk=_replay_from_json(d.get("indexer_topk")),
        weight_versions=tuple(
            WeightSpan(str(w["version"]), int(w["start"]), int(w["end"]))
            for w in d.get("weight_versions") or ()
        ),
    )
