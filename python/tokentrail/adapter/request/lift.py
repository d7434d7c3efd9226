"""Long strings taken out of a JSON body before it is parsed, so no parse holds the loop.

An image travels as one base64 string of up to 27 MB. One parser call over it is one C call
that holds the interpreter (and the event loop waiting for it) for tens of milliseconds.
`decode_lifting` replaces each long string value (one without escapes) by a short placeholder,
parses the rest, and makes each lifted value a `str` of its own from the body's bytes, a copy
that takes a few milliseconds. A body where a placeholder does not come back exactly once (a
"value" that was not one) is parsed whole, so the result is always the parser's own.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from typing import Any

from tokentrail.engines.wire_json import put_back

__all__ = ["LIFT_BYTES", "decode_lifting"]

# String values from this many bytes on are lifted out of the parse.
LIFT_BYTES = 256 * 1024
# What may lie between a key's colon and its value.
_SPACE = b" \t\r\n"
_MARK = "\0tokentrail-text-"


def decode_lifting(
    raw: bytes, decode: Callable[[bytes | memoryview], Any], start: int = 0, end: int = -1
) -> Any:
    """`decode(raw[start:end])` (`end` -1: to the end), with every string value of at least
    `LIFT_BYTES` bytes and no escape parsed apart. `decode` raises what it raises on the
    whole span, so a refused body is refused as before."""
    end = len(raw) if end < 0 else end
    view = memoryview(raw)
    spans = list(_long_strings(raw, start, end))
    if not spans:
        return decode(view[start:end])
    nonce = secrets.token_hex(8)
    parts: list[bytes | memoryview] = []
    lifted: dict[str, tuple[int, int]] = {}
    kept = start
    for begin, stop in spans:
        placeholder = f"{_MARK}{nonce}-{len(lifted)}"
        lifted[placeholder] = (begin, stop)
        parts += [view[kept:begin], json.dumps(placeholder)[1:-1].encode()]
        kept = stop
    parts.append(view[kept:end])
    try:
        tree = decode(b"".join(parts))
        texts = {key: str(view[begin:stop], "utf-8") for key, (begin, stop) in lifted.items()}
    except (ValueError, UnicodeDecodeError):
        return decode(view[start:end])
    if put_back(tree, texts, _MARK) != len(texts):
        return decode(view[start:end])
    return tree


def _long_strings(raw: bytes, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The content spans of the long string values in `raw[start:end]`: each after a key's
    closing quote (one not escaped inside a string), its colon and any space. Found with
    `find`: a pattern search over megabytes is one long call too."""
    at = raw.find(b'":', start, end)
    while at >= 0:
        after = at + 2
        if at > start and raw[at - 1] != ord("\\"):
            begin = after
            while begin < end and raw[begin] in _SPACE:
                begin += 1
            if begin < end and raw[begin] == ord('"'):
                close = raw.find(b'"', begin + 1, end)
                if close < 0:
                    return
                if close - begin > LIFT_BYTES and raw.find(b"\\", begin + 1, close) < 0:
                    yield begin + 1, close
                after = close + 1
        at = raw.find(b'":', after, end)
