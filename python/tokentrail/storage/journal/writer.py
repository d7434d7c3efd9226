"""A durable journal of every recorded turn, so a crashed rollout worker loses nothing it served.

SQLite in WAL mode, one row per event, laid out as `format` describes: each turn stores
what is new since the turn of its session it continues, so the journal grows with what the
sessions add, not with turns x context. One process writes a journal at a time
(`lock`); a second one gets a `JournalError` naming the holder's pid.

A turn is journaled before its reply is written and kept whether or not the reply arrives: a
retried request for it is answered from the record (`replayed`), never generated twice.

Durability: `synchronous=NORMAL` (the default) makes every appended event survive a crash of the
process (SIGKILL included): a commit returns once the WAL write reached the OS. Only a power
loss or kernel crash can lose the last commits; `synchronous=FULL` also survives those, at the
cost of an fsync per event (see `benches/journal_durability.py` for the measured cost).

Damage is reported, never silent. After each commit a line naming the event goes to
`FILE-receipts`, so events a damaged or cut WAL lost are known on the next open, per session,
and marked `lost` in their sessions. Recovery reads only the unfinished sessions' events and
checks each; a session stops at its first missing or damaged event, keeps what came before,
and the file is rebuilt from every intact event (the damaged one is moved aside, never deleted).
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import threading
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from tokentrail.errors import JournalError
from tokentrail.kinds import JournalEvent, JournalState, SyncMode, parse_kind
from tokentrail.messages import Message, ToolSchema
from tokentrail.storage.journal.format import (
    END_STATES,
    Base,
    Bases,
    Digest,
    TurnBase,
    TurnDecoder,
    blob_hash,
    digest,
    dump,
    encode_turn,
    event_crc,
    session_crc,
    tools_bytes,
)
from tokentrail.storage.journal.images import ImageReader, StoredImage, StoredImages
from tokentrail.storage.journal.lock import JournalLock
from tokentrail.storage.journal.open import (
    Lost,
    Recovery,
    SessionState,
    connect,
    load_live,
    prepare,
)
from tokentrail.storage.journal.receipts import Receipts, session_kinds
from tokentrail.storage.journal.record import JournaledTurn
from tokentrail.storage.journal.session import (
    Blobs,
    Event,
    SessionDamage,
    decode_events,
    session_rows,
    tail_lost,
)
from tokentrail.trajectory.lost import LostSpan
from tokentrail.trajectory.tree import MessageKey, shared_run

logger = logging.getLogger(__name__)


@dataclass
class _Writer:
    """One session's append state."""

    state: str
    last: int  # its last session sequence number
    first: int  # the global seq of its first event
    bases: Bases[Digest] = field(default_factory=Bases)
    tools: str | None = None  # hash of its last turn's tool list
    # Its last turn's messages and tool list as the objects it was given, with the messages'
    # digests: a harness resends the conversation every turn and the adapter's request memo
    # hands back the very objects of what is unchanged, so only what follows them is digested
    # and an unchanged tool list is not serialized again.
    seen: Sequence[Message] = ()
    seen_digests: list[Digest] = field(default_factory=list)
    seen_tools: object = None

    def digests(
        self, messages: Sequence[Message], keyed: tuple[Sequence[Message], Sequence[MessageKey]]
    ) -> list[Digest]:
        """Each message's `digest`, computed only past the leading run of the last turn's
        objects, from the routing key the caller computed for it when there is one (`keyed`:
        messages and their keys, position for position)."""
        n = shared_run(messages, self.seen, len(messages))
        digests = self.seen_digests[:n]
        known, keys = keyed
        for i in range(n, len(messages)):
            m = messages[i]
            key = keys[i] if i < len(keys) and i < len(known) and known[i] is m else None
            digests.append(digest(m, key))
        return digests


class Journal:
    """Append-only event journal; see the module docstring."""

    def __init__(self, path: str | Path, *, sync: SyncMode | str = SyncMode.NORMAL) -> None:
        self.sync = parse_kind(SyncMode, sync, "journal sync mode", JournalError)
        self.path = Path(path)
        self.recovery = Recovery()
        self._mutex = threading.Lock()
        # Append state of the sessions in memory: the unfinished ones, and those seen since.
        self._writers: dict[str, _Writer] = {}
        # Every tool list in `blobs`, as stored; the digest of every image in `images`.
        self._tool_lists: dict[str, bytes] = {}
        self._images = StoredImages()
        self._streamed = False
        self._lock = JournalLock(self.path)
        self._lock.acquire()
        self.receipts = Receipts(self.path)
        try:
            lost = self._open()
            self.receipts.open()
            self._mark_lost(lost)
        except BaseException:
            self.receipts.close()
            self._lock.release()
            raise

    # -- opening ------------------------------------------------------------------------------

    def _open(self) -> Lost:
        lost = prepare(self.path, self.receipts, self.recovery, partial(Journal, sync=self.sync))
        db = None
        try:
            db = connect(self.path, self.sync)
            live = load_live(db)
        except (sqlite3.DatabaseError, JournalError) as exc:
            if db is not None:
                db.close()
            self.recovery.rebuild(self.path, f"session index unreadable: {exc}")
            db = connect(self.path, self.sync)
            live = load_live(db)
        self._db = db
        self._adopt(live)
        return lost

    def _adopt(self, live: dict[str, SessionState]) -> None:
        """Take the index's word for the unfinished sessions (keeping what recovery decoded)."""
        for sid, entry in live.items():
            old = self._writers.get(sid)
            writer = self._writers[sid] = _Writer(entry.state, entry.last, entry.first)
            if old is not None:
                writer.bases, writer.tools = old.bases, old.tools
        self.recovery.live = list(live)
        for ref, data in self._db.execute("SELECT hash, data FROM blobs"):
            self._tool_lists[ref] = bytes(data)
        self._images.load(self._db)

    def _mark_lost(self, lost: Lost) -> None:
        """Mark, in their sessions, the events the receipts name and the file does not hold."""
        for sid, events in lost.items():
            writer = self._writer(sid)
            damage = tail_lost(sid, events, writer.last + 1)
            self.recovery.damaged.append(damage)
            logger.warning("journal %s: %s", self.path, damage.describe())
            self.lost(sid, damage.first, damage.lost, damage.reason, damage.turns)
            ends = [kind for _, kind in events if kind in END_STATES]
            if ends:
                # It had ended: so it stays, though its end was lost with the rest.
                self._append(
                    sid, parse_kind(JournalEvent, ends[-1], "journal event"), dump({"lost": True})
                )
                if sid in self.recovery.live:
                    self.recovery.live.remove(sid)
            elif sid not in self.recovery.live:
                self.recovery.live.append(sid)

    # -- recovery -----------------------------------------------------------------------------

    def live_events(self) -> Iterator[Event]:
        """Every unfinished session's events, session after session, checked and decoded.

        A session stops at its first missing or damaged event. Consume it to the end once,
        before appending: then the file is rebuilt if anything was damaged, and every session
        continues from what was yielded. A session that stops early ends with a `lost` event.
        """
        if self._streamed:
            raise JournalError("a journal's unfinished sessions can be read once, at opening")
        self._streamed = True
        blobs = Blobs(self._db)
        cut: dict[str, int] = {}
        kinds: dict[str, dict[int, str]] | None = None  # read from the receipts when needed
        for sid in list(self.recovery.live):
            writer = self._writer(sid)
            decoder = TurnDecoder(sid)
            damage: list[SessionDamage] = []
            good = 0
            rows = session_rows(self._db, sid)
            images = ImageReader(self._db)
            for event in decode_events(sid, rows, writer.last, blobs, images, damage, decoder):
                good = event.seq
                yield event
            writer.bases, writer.tools = decoder.bases.digested(), decoder.tools_ref
            if damage:
                kinds = session_kinds(self.receipts.path) if kinds is None else kinds
                damage = [d.counted(kinds.get(sid, {})) for d in damage]
                self.recovery.damaged.extend(damage)
                for d in damage:
                    logger.warning("journal %s: %s", self.path, d.describe())
                    yield Event(sid, d.first, JournalEvent.LOST, dict(d.span().to_dict()))
                cut[sid] = good
        if cut:
            self._db.close()
            self.receipts.close()
            self.recovery.rebuild(self.path, "damaged events in unfinished sessions", cut)
            self._db = connect(self.path, self.sync)
            self.receipts.open()
            self._adopt(load_live(self._db))

    # -- writing ------------------------------------------------------------------------------

    def _writer(self, sid: str) -> _Writer:
        writer = self._writers.get(sid)
        if writer is None:
            row = self._db.execute(
                "SELECT state, last, first FROM sessions WHERE sid = ?", (sid,)
            ).fetchone()
            writer = self._writers[sid] = _Writer(*row) if row else _Writer(JournalState.LIVE, 0, 0)
        return writer

    def _append(
        self,
        sid: str,
        kind: JournalEvent,
        payload: bytes,
        ids: bytes = b"",
        blob: tuple[str, bytes] | None = None,
        images: Sequence[StoredImage] = (),
    ) -> int:
        """Commit one event of `sid` (and what it is first to name); returns its number."""
        if not isinstance(sid, str) or not sid:
            raise JournalError("a journal event needs a session id")
        with self._mutex:
            writer = self._writer(sid)
            n = writer.last + 1
            state = END_STATES.get(kind, JournalState.LIVE)
            db = self._db
            try:
                db.execute("BEGIN")
                if blob is not None:
                    ref, data = blob
                    db.execute(
                        "INSERT OR IGNORE INTO blobs VALUES (?, ?, ?)",
                        (ref, data, zlib.crc32(data)),
                    )
                self._images.insert(db, images)
                crc = event_crc(sid, n, kind, payload, ids)
                cur = db.execute(
                    "INSERT INTO events (sid, sess_seq, kind, payload, ids, crc) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (sid, n, str(kind), payload, ids, crc),
                )
                seq = int(cur.lastrowid or 0)
                first = writer.first or seq
                db.execute(
                    "INSERT INTO sessions VALUES (?, ?, ?, ?, ?) ON CONFLICT(sid) DO UPDATE SET "
                    "state = excluded.state, last = excluded.last, crc = excluded.crc",
                    (sid, state, n, first, session_crc(sid, state, n, first)),
                )
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise JournalError(f"journal {self.path}: cannot append ({exc})") from None
            writer.last, writer.first, writer.state = n, first, state
            self._images.committed(images)
            self.receipts.write(seq, n, kind, sid)
            return n

    def ended(self, sid: str) -> str | None:
        """How the journal has `sid` ended ("finished" or "dropped", and not opened again
        since), or None while it is live or unknown."""
        writer = self._writers.get(sid)
        if writer is not None:
            return None if writer.state == JournalState.LIVE else str(writer.state)
        with self._mutex:
            row = self._db.execute("SELECT state FROM sessions WHERE sid = ?", (sid,)).fetchone()
        return None if row is None or row[0] == JournalState.LIVE else str(row[0])

    def set_meta(self, **values: str) -> None:
        for key, value in values.items():
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def meta(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT key, value FROM meta").fetchall())

    def session_opened(self, sid: str, settings: dict[str, Any]) -> None:
        self._append(sid, JournalEvent.OPEN, dump(settings))

    def session_finished(self, sid: str, reward: float, metadata: dict[str, Any]) -> None:
        self._append(sid, JournalEvent.FINISH, dump({"reward": reward, "metadata": metadata}))
        self._forget(sid)

    def session_dropped(self, sid: str, details: dict[str, Any] | None = None) -> None:
        """The session is gone without samples; `details` say why (an eviction, say)."""
        self._append(sid, JournalEvent.DROP, dump(dict(details or {})))
        self._forget(sid)

    def lost(self, sid: str, first: int, events: int, reason: str, turns: int = -1) -> None:
        """`events` events of `sid` from #`first` on, `turns` of them turns, were lost."""
        self._append(sid, JournalEvent.LOST, dump(LostSpan(first, events, turns, reason).to_dict()))

    def replayed(self, sid: str, turn: int) -> None:
        """Turn `turn` (its session sequence number) answered a retried request again."""
        self._append(sid, JournalEvent.REPLAY, dump({"turn": turn}))

    def turn(
        self,
        turn: JournaledTurn,
        *,
        keyed: tuple[Sequence[Message], Sequence[MessageKey]] = ((), ()),
    ) -> int:
        """Journal a generated turn of `turn.sid`; returns its session sequence number (the
        record's own `seq` is not read).

        `keyed` are messages whose routing keys the caller computed, and those keys (the
        pipeline's recorded messages): a message of `turn.translated` at the same position
        that is one of them is not keyed again.

        `turn.answer` is what answers a retry of it again (the adapter's reply and the
        sampling it was made with), kept as given; `turn.supersedes` says it was generated for
        a retry and replaces the earlier turns of its prompt.
        """
        sid, translated, tools = turn.sid, turn.translated, turn.tools
        writer = self._writer(sid)
        prompt = np.asarray(turn.prompt_ids, dtype=np.uint32)
        output = np.asarray(turn.output_ids, dtype=np.uint32)
        tbase, prefix, shared = writer.bases.token_base(prompt)
        digests = writer.digests(translated, keyed)
        mbase, keep = writer.bases.message_base(digests)
        ref, blob = _tools_ref(self._tool_lists, writer, tools)
        stored, images = self._images.split(turn.metadata)  # Their bytes go into `images`, once.
        encoded = encode_turn(
            dataclasses.replace(turn, prompt_ids=prompt, output_ids=output, metadata=stored),
            TurnBase(mbase, keep, tbase, prefix, ref),
        )
        try:
            n = self._append(sid, JournalEvent.TURN, encoded.payload, encoded.ids, blob, images)
        except JournalError:
            if blob is not None:
                self._tool_lists.pop(blob[0], None)  # it never reached `blobs`
            raise
        writer.bases.add(Base(n, prompt, output, digests), shared)
        writer.tools = ref
        writer.seen, writer.seen_digests, writer.seen_tools = tuple(translated), digests, tools
        return n

    def _forget(self, sid: str) -> None:
        self._writers.pop(sid, None)

    def close(self) -> None:
        try:
            self._db.close()
            self.receipts.close()
        finally:
            self._lock.release()


def _tools_ref(
    tool_lists: dict[str, bytes], writer: _Writer, tools: list[ToolSchema] | None
) -> tuple[str | None, tuple[str, bytes] | None]:
    """The hash naming `tools` in `blobs`, and the blob to insert when it is new (compared
    as bytes, key order included: a template renders the schemas in their order)."""
    if tools is None:
        return None, None
    if tools is writer.seen_tools and writer.tools is not None:
        return writer.tools, None
    data = tools_bytes(tools)
    if writer.tools is not None and tool_lists.get(writer.tools) == data:
        return writer.tools, None
    ref = blob_hash(data)
    if ref in tool_lists:
        return ref, None
    tool_lists[ref] = data
    return ref, (ref, data)
