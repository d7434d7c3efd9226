"""A request's bytes to its JSON object: the second step of a body's way through
`adapter.request` (read, parse, limit, translate).

`parse_body` parses the bytes whole or refuses them with a 400 that names what is wrong and
where: bytes that are not UTF-8, text that is not JSON (`NaN`, `Infinity` and numbers past a
double's range included), nesting deeper than the limit, and a lone surrogate (`"\ud800"`) in
any string, named by its field, since no encoder downstream (the tokenizer, the journal, an HTTP
header) can take one.

`parse_reusing` parses only what is new: a harness resends the whole conversation every turn.
The core (the backend `load_backend` selects) indexes a body (`index_body`: the byte spans of
its top-level fields and of its messages) and compares it with the session's previous body
(`request.memo`). A field or message whose bytes are unchanged takes the previous parse's value;
the rest is parsed (msgspec, which reads numbers and strings as the standard library does),
its long strings (an image's base64) apart, so no one call holds the loop (`request.lift`).
Bodies the index does not take, or that hold what only the full parse checks (an escape that may
be a lone surrogate, nesting past the limit, more values than one parse may hold the loop for),
go through `parse_body` whole, as does any body msgspec refuses, so every error a body gets is
the one a full parse names.
"""

from __future__ import annotations

import json
import json.scanner
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from tokentrail.adapter.protocols.base import WireProtocol
from tokentrail.adapter.protocols.resume import ResumableProtocol
from tokentrail.adapter.request.lift import decode_lifting
from tokentrail.adapter.request.memo import KnownRequest
from tokentrail.core.backend import load_backend
from tokentrail.errors import BodyShapeError, RequestError

if TYPE_CHECKING:
    from tokentrail import _core

__all__ = [
    "STEPWISE_ABOVE",
    "Parsed",
    "check_tree",
    "field_path",
    "parse_body",
    "parse_reusing",
]

_DECODER = msgspec.json.Decoder()
# A lone surrogate can only come from a `\uD800`..`\uDFFF` escape: UTF-8 cannot encode one, so
# bodies without such an escape need no search of their strings.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# Above this many structural bytes a body is parsed in Python steps rather than in one C call,
# so a body of millions of tiny values cannot hold the interpreter (and the event loop waiting
# for it) for a second; below it, one call costs at most a few milliseconds.
STEPWISE_ABOVE = 50_000


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _decoder(stepwise: bool) -> json.JSONDecoder:
    decoder = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)
    if stepwise:
        decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder


def parse_body(raw: bytes, max_depth: int) -> dict[str, Any]:
    """The JSON object in `raw`; `RequestError` (400) for anything else."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"body is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    structural = raw.count(b",") + raw.count(b"{") + raw.count(b"[")
    try:
        body = _decoder(structural > STEPWISE_ABOVE).decode(text)
    except RecursionError:
        raise RequestError(f"body is nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise RequestError(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(f"body must be a JSON object, got {type(body).__name__}")
    check_tree(body, max_depth=max_depth, surrogates=bool(_SURROGATE_ESCAPE.search(raw)))
    return body


def check_tree(
    root: dict[str, Any] | list[Any],
    *,
    max_depth: int,
    surrogates: bool,
    at: tuple[str | int, ...] = (),
) -> None:
    """Refuse nesting deeper than `max_depth` (the body itself is level 1) and, when
    `surrogates`, any string or key holding a lone surrogate. `root` lies at path `at` of the
    body (one level deeper per step). Iterative: no depth can make it recurse."""
    stack: list[tuple[dict[str, Any] | list[Any], int, tuple[str | int, ...]]] = [
        (root, len(at) + 1, at)
    ]
    while stack:
        value, depth, path = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if surrogates:
                if isinstance(key, str) and _lone_surrogate(key):
                    raise RequestError(f"{field_path(path)} has a key with a lone surrogate")
                if isinstance(item, str) and _lone_surrogate(item):
                    raise RequestError(
                        f"{field_path((*path, key))} holds a lone surrogate, which is not valid "
                        "Unicode; send text as UTF-8"
                    )
            if isinstance(item, dict | list):
                if depth + 1 > max_depth:
                    raise RequestError(
                        f"{field_path((*path, key))} is nested deeper than {max_depth} levels"
                    )
                if item:
                    stack.append((item, depth + 1, (*path, key)))


def _lone_surrogate(text: str) -> bool:
    return not text.isascii() and _LONE_SURROGATE.search(text) is not None


def field_path(path: Sequence[str | int]) -> str:
    """`("messages", 0, "content")` as `messages[0].content`; the empty path is `body`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    if len(out) > 120:  # a path 800 levels deep is not worth printing whole
        out = f"{out[:60]}...{out[-50:]}"
    return out or "body"


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
    if previous is not None and previous.protocol != proto.name:
        previous = None
    try:
        # The previous body's index holds for the bytes both share: only the rest is scanned.
        after = None if previous is None else (previous.raw, previous.index)
        index = load_backend().index_body(raw, array, after)
    except BodyShapeError:
        return Parsed(parse_body(raw, max_depth))
    if index.surrogate_escape or index.depth > max_depth or index.structural > STEPWISE_ABOVE:
        return Parsed(parse_body(raw, max_depth))
    try:
        if previous is None:
            body = decode_lifting(raw, _DECODER.decode)
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
            body[key] = _elements(raw, index, previous, key, first_changed)
        elif key in changed:
            body[key] = decode_lifting(raw, _DECODER.decode, start, end)
        else:
            body[key] = previous.body[key]
    if array_at is None or previous.index.array_field is None:
        first_changed = 0
    return Parsed(body, index, frozenset(changed), first_changed, previous)


def _elements(
    raw: bytes,
    index: _core.BodyIndex,
    previous: KnownRequest,
    key: str,
    first_changed: int,
) -> list[Any]:
    before = previous.body.get(key)
    kept = before[:first_changed] if isinstance(before, list) else []
    if len(kept) < first_changed:
        kept = []
        first_changed = 0
    new = index.elements_from(first_changed)
    return kept + [decode_lifting(raw, _DECODER.decode, start, end) for start, end in new]
