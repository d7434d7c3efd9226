"""What a session's request shares with its previous one: a harness resends the whole
conversation every turn, and only the parse and translation of what is new are done again.

The core (the backend `load_backend` selects) indexes a body (`index_body`: the byte spans of its
top-level fields and of its messages) and compares it with the session's previous body. A field
or message whose bytes are unchanged takes the previous parse's value; the rest is parsed
(msgspec, which reads numbers and strings as the standard library does); the translation resumes
after the last unchanged message when the fields it reads are unchanged too
(`protocols.resume`). Bodies the index does not take, or that hold what only the full parse
checks (an escape that may be a lone surrogate, nesting past the limit, more values than one
parse may hold the loop for), go through `validation.parse_body` whole, as does any body msgspec
refuses, so every error a body gets is the one a full parse names.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from tokentrail.adapter.protocols.common import WireProtocol
from tokentrail.adapter.protocols.resume import ResumableProtocol, Translated
from tokentrail.adapter.request.parse import STEPWISE_ABOVE, check_translated, parse_body
from tokentrail.core.backend import load_backend
from tokentrail.errors import BodyShapeError, RequestError
from tokentrail.messages import Conversation

if TYPE_CHECKING:
    from tokentrail import _core

__all__ = [
    "KnownRequest",
    "Parsed",
    "RequestMemo",
    "first_difference",
    "parse_reusing",
    "translate_reusing",
]

_DECODER = msgspec.json.Decoder()


@dataclass(frozen=True)
class KnownRequest:
    """A session's latest request: its bytes, their index, the parse and the translation."""

    protocol: str
    raw: bytes
    index: _core.BodyIndex
    body: dict[str, Any]
    translated: Translated | None = None


@dataclass(frozen=True)
class Parsed:
    """A parsed body and what it shares with the session's previous one."""

    body: dict[str, Any]
    index: _core.BodyIndex | None = None
    # Top-level fields whose bytes differ from the previous body's (all when there is none).
    changed: frozenset[str] = frozenset()
    # Messages before this one are the previous body's, byte for byte (and object for object).
    first_changed: int = 0
    previous: KnownRequest | None = None

    def unchanged(self, fields: frozenset[str]) -> bool:
        """Whether all of `fields` kept their bytes (present or absent in both bodies)."""
        return self.previous is not None and not (fields & self.changed)


def parse_reusing(
    raw: bytes, proto: WireProtocol, previous: KnownRequest | None, max_depth: int
) -> Parsed:
    """`raw` parsed, reusing `previous`'s values for what kept its bytes; `RequestError` for
    what `parse_body` refuses."""
    array = proto.array_field if isinstance(proto, ResumableProtocol) else "messages"
    try:
        index = load_backend().index_body(raw, array)
    except BodyShapeError:
        return Parsed(parse_body(raw, max_depth))
    if index.surrogate_escape or index.depth > max_depth or index.structural > STEPWISE_ABOVE:
        return Parsed(parse_body(raw, max_depth))
    if previous is not None and previous.protocol != proto.name:
        previous = None
    try:
        if previous is None:
            body = _DECODER.decode(raw)
            return Parsed(body, index, frozenset(body))
        return _parse_changed(raw, index, previous)
    except msgspec.DecodeError:
        # The full parse names what is wrong (and takes what only msgspec refuses).
        return Parsed(parse_body(raw, max_depth))


def _parse_changed(raw: bytes, index: _core.BodyIndex, previous: KnownRequest) -> Parsed:
    changed_at, first_changed = load_backend().diff_bodies(previous.raw, previous.index, raw, index)
    fields = index.fields
    array_at = index.array_field
    changed = {fields[pos][0] for pos in changed_at}
    # A field the previous body had and this one lacks changed too.
    changed.update(previous.body.keys() - {key for key, _, _ in fields})
    body: dict[str, Any] = {}
    for pos, (key, start, end) in enumerate(fields):
        if pos == array_at:
            body[key] = _elements(raw, index.elements, previous, key, first_changed)
        elif key in changed:
            body[key] = _DECODER.decode(raw[start:end])
        else:
            body[key] = previous.body[key]
    if array_at is None or previous.index.array_field is None:
        first_changed = 0
    return Parsed(body, index, frozenset(changed), first_changed, previous)


def _elements(
    raw: bytes,
    spans: Sequence[tuple[int, int]],
    previous: KnownRequest,
    key: str,
    first_changed: int,
) -> list[Any]:
    before = previous.body.get(key)
    kept = before[:first_changed] if isinstance(before, list) else []
    if len(kept) < first_changed:
        kept = []
        first_changed = 0
    return kept + [_DECODER.decode(raw[start:end]) for start, end in spans[first_changed:]]


def translate_reusing(
    proto: WireProtocol, parsed: Parsed, full: Callable[[], Conversation], max_depth: int
) -> Translated:
    """`parsed.body` translated, resumed from the session's previous request when the messages
    before `parsed.first_changed` and the fields translation reads are unchanged (`full`
    translates and checks it whole otherwise). Only messages and tools new to this request are
    checked again (`check_tree`, one level deeper than a body: arguments are JSON in JSON)."""
    body = parsed.body
    if not isinstance(proto, ResumableProtocol) or proto.continues(body) is not None:
        return Translated(full())
    known = parsed.previous.translated if parsed.previous is not None else None
    if known is None or not parsed.unchanged(proto.context_fields):
        known = None
    try:
        translated = proto.translate_from(body, known, parsed.first_changed)
    except RecursionError:
        raise RequestError("the request is nested too deep to translate") from None
    conversation = translated.conversation
    before = known.conversation if known is not None else None
    shared = 0
    if before is not None:
        for new, old in zip(conversation.messages, before.messages, strict=False):
            if new is not old:
                break
            shared += 1
    conversation.unchanged = shared
    same_tools = before is not None and conversation.tools is before.tools
    check_translated(conversation, max_depth=max_depth, first=shared, tools=not same_tools)
    return translated


def first_difference(resumed: Conversation, full: Conversation) -> str | None:
    """Where a resumed translation differs from the full one (None: nowhere). Messages are
    compared as JSON, so key order and number types count, as they do in a render."""
    if len(resumed.messages) != len(full.messages):
        return f"{len(resumed.messages)} messages, not {len(full.messages)}"
    for pos, (a, b) in enumerate(zip(resumed.messages, full.messages, strict=True)):
        if json.dumps(a, default=repr) != json.dumps(b, default=repr):
            return f"message {pos}: {json.dumps(a, default=repr)[:200]} is not the full one's"
    fields = {
        "tools": (resumed.tools, full.tools),
        "tool_choice": (resumed.tool_choice, full.tool_choice),
        "forced_tool": (resumed.forced_tool, full.forced_tool),
        "withheld_tools": (resumed.withheld_tools, full.withheld_tools),
        "dropped_media": (resumed.dropped_media, full.dropped_media),
        "call_ids": (resumed.call_ids, full.call_ids),
    }
    return next((name for name, (a, b) in fields.items() if a != b), None)


class RequestMemo:
    """The latest request of each of the most recent sessions (at most `capacity`; 0: none).

    Per session, not shared: a body is only ever compared with its own session's previous one.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._known: OrderedDict[str, KnownRequest] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, sid: str | None) -> KnownRequest | None:
        if sid is None or not self.capacity:
            return None
        with self._lock:
            known = self._known.get(sid)
            if known is not None:
                self._known.move_to_end(sid)
            return known

    def put(self, sid: str, known: KnownRequest) -> None:
        if not self.capacity:
            return
        with self._lock:
            self._known[sid] = known
            self._known.move_to_end(sid)
            while len(self._known) > self.capacity:
                self._known.popitem(last=False)

    def forget(self, sid: str) -> None:
        with self._lock:
            self._known.pop(sid, None)

    def __len__(self) -> int:
        return len(self._known)
