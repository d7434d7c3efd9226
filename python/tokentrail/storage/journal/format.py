"""How a journal's events are laid out: tables, checksums, and turns stored as what is new.

Schema 3. Every event is one row of `events` with its session's own sequence number
(`sess_seq`, 1, 2, 3, ... per session) and a CRC32 over its session, number, kind, payload and
ids, so each event can be checked on its own and a missing one shows as a gap. `sessions` holds
each session's state and last sequence number (what a reader expects to find), `blobs` holds
each distinct tool list once, `images` each distinct image's bytes once, by digest (`images`:
a turn's tags name its prompt's images without their bytes).

A turn stores only what is new since a turn of its session it continues (its *base*): the
translated messages after the ones it shares with the base, and the prompt ids after the prefix
it shares with the base's prompt + output. Bases are the session's last few conversation
branches (`Bases`), so a sub-agent's turns and the main conversation's each continue their own.
Writer and reader keep `Bases` by the same rule, so the base an event names is always there.
A turn's payload and ids are deflated when that makes them smaller (`shrink`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypedDict, TypeVar

import numpy as np

from tokentrail.core.backend import load_backend
from tokentrail.core.discarded import Discarded
from tokentrail.core.ids import LogprobArray, TokenArray
from tokentrail.core.routing import ReplayRows, WeightSpan
from tokentrail.errors import JournalError
from tokentrail.kinds import Fallback, History, JournalEvent, JournalState, ReplayGap, parse_kind
from tokentrail.messages import Message, ToolSchema
from tokentrail.storage.journal.record import JournaledTurn
from tokentrail.trajectory.tree import MessageKey, message_key, shared_run

SCHEMA_VERSION = 3
# The schemas whose events this reader decodes as its own: schema 2 differs only in having no
# `images` table (its turns' tags carry their images' bytes, read as they are), and is made
# schema 3 in place when a writer opens it (`migrate.upgrade_v2`).
SAME_EVENTS = (2, SCHEMA_VERSION)
# How many conversation branches of a session a turn may take as its base.
MAX_BASES = 4

IMAGES_TABLE = (
    "CREATE TABLE IF NOT EXISTS images (digest TEXT PRIMARY KEY, media_type TEXT NOT NULL, "
    "data BLOB NOT NULL, crc INTEGER NOT NULL)"
)
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    "sid TEXT NOT NULL, sess_seq INTEGER NOT NULL, kind TEXT NOT NULL, payload BLOB NOT NULL, "
    "ids BLOB NOT NULL, crc INTEGER NOT NULL)",
    "CREATE UNIQUE INDEX IF NOT EXISTS events_by_session ON events (sid, sess_seq)",
    "CREATE TABLE IF NOT EXISTS sessions (sid TEXT PRIMARY KEY, state TEXT NOT NULL, "
    "last INTEGER NOT NULL, first INTEGER NOT NULL, crc INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS blobs (hash TEXT PRIMARY KEY, data BLOB NOT NULL, "
    "crc INTEGER NOT NULL)",
    IMAGES_TABLE,
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
)

END_STATES = {JournalEvent.FINISH: JournalState.FINISHED, JournalEvent.DROP: JournalState.DROPPED}


def event_crc(sid: str, sess_seq: int, kind: str, payload: bytes, ids: bytes) -> int:
    head = f"{sid}\x00{sess_seq}\x00{kind}\x00".encode()
    return zlib.crc32(ids, zlib.crc32(payload, zlib.crc32(head)))


def session_crc(sid: str, state: str, last: int, first: int) -> int:
    return zlib.crc32(f"{sid}\x00{state}\x00{last}\x00{first}".encode())


def blob_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def dump(data: object) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def tools_bytes(tools: Sequence[ToolSchema]) -> bytes:
    # Key order kept: a template renders the schemas as they are, in their order.
    return dump(tools)


def prefix_len(a: TokenArray, b: TokenArray) -> int:
    return load_backend().common_prefix_len(a, b)


# A message's identity as the writer keeps it (`digest`).
Digest = tuple[int, int]
# What a branch holds of its messages: the writer their digests, a reader the messages.
Item = TypeVar("Item")


def digest(message: Message, key: MessageKey | None = None) -> Digest:
    """A message's identity for finding what a turn shares with its base (writer side only:
    Python's string hash is per process). Key order is ignored, as in routing: `key`, when
    given, is the message's routing key, computed already."""
    if key is None:
        key = message_key(message)
    return hash(key), len(key[1])


def _leading_equal(a: Sequence[object], b: Sequence[object]) -> int:
    """How many leading items of `a` and `b` are equal. The digests a turn carries on from
    its base are the very same objects: those are compared in C, only the rest by value."""
    n, end = shared_run(a, b, len(b)), min(len(a), len(b))
    while n < end and a[n] == b[n]:
        n += 1
    return n


@dataclass
class Base(Generic[Item]):
    """One conversation branch a later turn may continue: its latest turn."""

    seq: int
    # Its prompt and output ids, kept as given (the writer's are the pipeline's own arrays):
    # a branch's tokens are the prompt then the output, never joined into a copy.
    prompt: TokenArray
    output: TokenArray
    # The writer keeps message digests, a reader the messages themselves.
    messages: list[Item]

    def __len__(self) -> int:
        return len(self.prompt) + len(self.output)

    def shared(self, ids: TokenArray) -> int:
        """How many leading ids of `ids` are this branch's prompt then output."""
        n = prefix_len(self.prompt, ids)
        if n == len(self.prompt) and len(ids) > n and len(self.output):
            n += prefix_len(self.output, ids[n:])
        return n

    def head(self, n: int) -> list[TokenArray]:
        """Its first `n` tokens, as parts (for one concatenation with what follows)."""
        cut = len(self.prompt)
        return [self.prompt[:n]] if n <= cut else [self.prompt, self.output[: n - cut]]


@dataclass
class Bases(Generic[Item]):
    """A session's last few branches; the writer and every reader update them the same way."""

    items: list[Base[Item]] = field(default_factory=list)

    def get(self, seq: int) -> Base[Item]:
        for base in self.items:
            if base.seq == seq:
                return base
        raise JournalError(f"turn base #{seq} is not one of the session's last branches")

    def token_base(self, prompt: TokenArray) -> tuple[int, int, list[int]]:
        """(base seq, shared prefix) of the branch sharing the longest prefix, and every
        branch's shared prefix (for `add`)."""
        shared = [b.shared(prompt) for b in self.items]
        best, at = 0, 0
        for base, n in zip(self.items, shared, strict=True):
            if n > at or (n == at and n):
                best, at = base.seq, n
        return best, at, shared

    def message_base(self, digests: list[Item]) -> tuple[int, int]:
        """(base seq, shared messages) of the branch sharing the most leading messages."""
        best, keep = 0, 0
        for base in self.items:
            n = _leading_equal(base.messages, digests)
            if n > keep or (n == keep and n):
                best, keep = base.seq, n
        return best, keep

    def digested(self: Bases[Message]) -> Bases[Digest]:
        """A reader's branches as a writer keeps them: messages as digests."""
        return Bases(
            [Base(b.seq, b.prompt, b.output, list(map(digest, b.messages))) for b in self.items]
        )

    def add(self, base: Base[Item], shared: list[int]) -> None:
        """A new turn: it replaces the branches its prompt contains; the oldest go beyond
        `MAX_BASES`. `shared` is each branch's prefix with the new prompt."""
        kept = [b for b, n in zip(self.items, shared, strict=True) if n < len(b)]
        self.items = [*kept, base][-MAX_BASES:]


@dataclass
class EncodedTurn:
    payload: bytes
    ids: bytes


@dataclass(frozen=True)
class TurnBase:
    """What a turn is stored against: the branch whose messages it continues (`mbase`, its
    first `keep` messages shared), the branch whose ids it continues (`tbase`, its first
    `prefix` prompt ids shared; 0: none), and the hash of its tool list in `blobs`."""

    mbase: int
    keep: int
    tbase: int
    prefix: int
    tools_ref: str | None


def encode_turn(turn: JournaledTurn, base: TurnBase) -> EncodedTurn:
    """`turn`'s event: what is new since `base`. Its metadata is stored as given (the writer
    has taken its images' bytes out); empty logprobs are stored as none."""
    tail = np.asarray(turn.prompt_ids, dtype=np.uint32)[base.prefix :]
    output = np.asarray(turn.output_ids, dtype=np.uint32)
    lps = turn.logprobs
    logprobs = np.asarray(lps, np.float32) if lps is not None and len(lps) else None
    history, fallback = turn.history, turn.fallback
    data = {
        "mbase": base.mbase,
        "keep": base.keep,
        "new": list(turn.translated[base.keep :]),
        "tools": base.tools_ref,
        "tbase": base.tbase,
        "prefix": base.prefix,
        "tail": len(tail),
        "output": len(output),
        "logprobs": logprobs is not None,
        "response": turn.response_message,
        "finish_reason": turn.finish_reason,
        "ill_formed": turn.ill_formed,
        "metadata": turn.metadata,
        "history": None if history is None else history.value,
        "fallback": None if fallback is None else fallback.value,
        "answer": turn.answer,
        "supersedes": turn.supersedes,
    }
    # Replay data, only when the engine reported some (most turns carry none).
    if turn.routed_experts is not None:
        data["routed_experts"] = replay_json(turn.routed_experts)
    if turn.indexer_topk is not None:
        data["indexer_topk"] = replay_json(turn.indexer_topk)
    if turn.weight_versions:
        data["weight_versions"] = [span.to_dict() for span in turn.weight_versions]
    # Only for a turn retried after the engine aborted it (a reader before them ignores it).
    if turn.discarded:
        data["discarded"] = [attempt.to_dict() for attempt in turn.discarded]
    parts = [tail.astype("<u4", copy=False).tobytes(), output.astype("<u4", copy=False).tobytes()]
    if logprobs is not None:
        parts.append(logprobs.astype("<f4", copy=False).tobytes())
    ids = shrink(b"".join(parts))
    data["zipped_ids"] = ids[:1] == ZLIB_HEAD
    return EncodedTurn(shrink(dump(data)), ids)


class ReplayGapJson(TypedDict):
    """A turn without replay rows on a channel: why."""

    gap: str


class ReplayRowsJson(TypedDict):
    """A turn's replay rows on a channel: from `start`, `shape` rows of `dtype`, base64."""

    start: int
    dtype: str
    shape: list[int]
    data: str


def replay_json(rows: ReplayRows) -> ReplayGapJson | ReplayRowsJson:
    """A turn's replay rows for the journal: the gap, or the start and the rows in the
    smallest integer type that holds them, base64 of little-endian bytes."""
    if rows.rows is None:
        return {"gap": str(rows.gap or ReplayGap.ENGINE_RETURNED_NONE)}
    values = rows.rows
    dtype: np.dtype = np.dtype("<i4")
    if values.size == 0 or values.min() >= 0:
        top = int(values.max()) if values.size else 0
        dtype = np.dtype("<u1" if top < 2**8 else "<u2" if top < 2**16 else "<u4")
    data = base64.b64encode(values.astype(dtype).tobytes()).decode("ascii")
    return {"start": rows.start, "dtype": dtype.str, "shape": list(values.shape), "data": data}


def replay_from_json(d: dict[str, Any] | None) -> ReplayRows | None:
    if d is None:
        return None
    if "gap" in d:
        return ReplayRows.missing(parse_kind(ReplayGap, d["gap"], "replay gap", JournalError))
    values = np.frombuffer(base64.b64decode(d["data"]), dtype=np.dtype(d["dtype"]))
    return ReplayRows(values.reshape(tuple(d["shape"])), int(d["start"]))


def weight_spans(data: Sequence[dict[str, Any]] | None) -> tuple[WeightSpan, ...]:
    return tuple(WeightSpan(str(w["version"]), int(w["start"]), int(w["end"])) for w in data or ())


# A turn's payload (JSON, which starts with "{") and ids are stored deflated when that makes
# them smaller: token ids and text both shrink several times, at level 1 in well under a
# millisecond per turn. A deflate stream at this level starts with this byte.
ZLIB_HEAD = b"\x78"


def shrink(data: bytes) -> bytes:
    packed = zlib.compress(data, 1)
    return packed if len(packed) < len(data) else data


def payload_bytes(payload: bytes) -> bytes:
    """A stored payload as JSON bytes."""
    return zlib.decompress(payload) if payload[:1] == ZLIB_HEAD else payload


@dataclass
class DecodedIds:
    tail: TokenArray
    output: TokenArray
    logprobs: LogprobArray | None


def decode_ids(data: dict[str, Any], ids: bytes) -> DecodedIds:
    if data.get("zipped_ids"):
        ids = zlib.decompress(ids)
    n_tail, n_out = int(data["tail"]), int(data["output"])
    words = np.frombuffer(ids, dtype="<u4", count=n_tail + n_out)
    lps = None
    if data["logprobs"]:
        lps = np.frombuffer(ids, dtype="<f4", offset=4 * (n_tail + n_out), count=n_out)
        lps = lps.astype(np.float32)
    return DecodedIds(words[:n_tail].astype(np.uint32), words[n_tail:].astype(np.uint32), lps)


@dataclass
class TurnDecoder:
    """A reader's state for one session: the branches its turns are stored against."""

    sid: str
    bases: Bases[Message] = field(default_factory=Bases)
    # The hash of the last turn's tool list.
    tools_ref: str | None = None

    def decode(
        self,
        seq: int,
        data: dict[str, Any],
        ids: bytes,
        tools_of: Callable[[str], list[ToolSchema]],
        with_images: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> JournaledTurn:
        """The turn `data`/`ids` describe; `tools_of(hash)` reads a tool list from `blobs`,
        `with_images(tags)` joins its images' bytes back into its tags (`images`)."""
        decoded = decode_ids(data, ids)
        base_messages = self.bases.get(data["mbase"]).messages if data["mbase"] else []
        translated = [*base_messages[: data["keep"]], *data["new"]]
        if data["tbase"]:
            held = self.bases.get(data["tbase"]).head(data["prefix"])
            prompt = np.concatenate([*held, decoded.tail])
        else:
            prompt = decoded.tail
        ref = data["tools"]
        tools = None if ref is None else tools_of(ref)
        _, _, shared = self.bases.token_base(prompt)
        self.bases.add(Base(seq, prompt, decoded.output, translated), shared)
        self.tools_ref = ref
        return JournaledTurn(
            sid=self.sid,
            seq=seq,
            translated=translated,
            response_message=data["response"],
            tools=tools,
            prompt_ids=prompt,
            output_ids=decoded.output,
            logprobs=decoded.logprobs,
            finish_reason=data["finish_reason"],
            ill_formed=data["ill_formed"],
            metadata=with_images(data["metadata"]),
            history=None
            if data["history"] is None
            else parse_kind(History, data["history"], "history mode", JournalError),
            fallback=None
            if data["fallback"] is None
            else parse_kind(Fallback, data["fallback"], "fallback", JournalError),
            answer=data.get("answer"),
            supersedes=bool(data.get("supersedes", False)),
            routed_experts=replay_from_json(data.get("routed_experts")),
            indexer_topk=replay_from_json(data.get("indexer_topk")),
            weight_versions=weight_spans(data.get("weight_versions")),
            discarded=tuple(Discarded.from_dict(d) for d in data.get("discarded") or ()),
        )


@dataclass
class Row:
    """One event row as read, checked against its CRC by `verify`."""

    seq: int
    sid: str
    sess_seq: int
    kind: str
    payload: bytes
    ids: bytes
    crc: int

    def verify(self) -> bool:
        return event_crc(self.sid, self.sess_seq, self.kind, self.payload, self.ids) == self.crc

    def data(self) -> dict[str, Any]:
        try:
            value = json.loads(payload_bytes(self.payload))
        except zlib.error as exc:
            raise ValueError(f"payload cannot be inflated ({exc})") from None
        if not isinstance(value, dict):
            raise ValueError("payload is not an object")
        return value


ROW_COLUMNS = "seq, sid, sess_seq, kind, payload, ids, crc"
