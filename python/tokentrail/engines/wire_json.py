"""An engine's JSON answer decoded without holding the interpreter for long.

A long turn's answer is megabytes of small numbers (SGLang's `output_token_logprobs` entries,
`output_ids`, vLLM's `token_logprobs`): one `json.loads` over it is one C call that holds the
GIL, and the event loop waiting for it, for a tenth of a second. `loads_in_pieces` parses each
long array of numbers (or of flat arrays of numbers) a piece at a time, and the rest of the
answer, small once they are out, in one call. The result is exactly `json.loads`'s: an array is
split only between its elements, and any piece that does not parse sends the whole answer to
`json.loads`, which names what is wrong.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

__all__ = ["PIECE_BYTES", "loads_in_pieces"]

# Arrays are parsed this many bytes at a time (about a millisecond of parsing each).
PIECE_BYTES = 32 * 1024
# What may lie between a key and its value.
_SPACE = b" \t\r\n"
# Where the next element of an array of arrays begins: after a `]` and its comma.
_NEXT_ROW = re.compile(rb"\]\s*,")
# An array of arrays (of rows), split after a row.
_ROWS = re.compile(rb"\s*\[")
# What a lifted array stands as while the rest of the answer is parsed.
_MARK = "\0tokentrail-array-"


class _NotPieces(Exception):
    """An array that does not split into pieces that parse: the whole answer is parsed."""


def loads_in_pieces(raw: bytes | bytearray, piece_bytes: int = PIECE_BYTES) -> Any:
    """`json.loads(raw.decode("utf-8"))`, with every array value of more than `piece_bytes`
    that holds no string parsed `piece_bytes` at a time."""
    nonce = secrets.token_hex(8)
    view = memoryview(raw)
    parts: list[bytes | memoryview] = []
    lifted: dict[str, list[Any]] = {}
    kept = 0
    try:
        for begin in _array_values(raw):
            if begin < kept:
                continue
            quote = raw.find(b'"', begin)
            stop = len(raw) if quote < 0 else quote
            if stop - begin <= piece_bytes:
                continue
            # No string inside: the array ends at the last `]` before the next quote, or its
            # pieces do not parse.
            end = raw.rfind(b"]", begin, stop)
            if end < 0:
                continue
            placeholder = f"{_MARK}{nonce}-{len(lifted)}"
            lifted[placeholder] = _array(view[begin + 1 : end].tobytes(), piece_bytes)
            parts += [view[kept:begin], json.dumps(placeholder).encode()]
            kept = end + 1
        if lifted:
            parts.append(view[kept:])
            # A "key" that was the start of a string value puts the placeholder inside that
            # string, where its quotes and escape cannot parse: the whole answer is parsed then.
            return _put_back(json.loads(b"".join(parts).decode("utf-8")), lifted)
    except (_NotPieces, ValueError):
        pass
    return json.loads(bytes(raw).decode("utf-8"))


def _array_values(raw: bytes | bytearray) -> Iterator[int]:
    """Where each array that is a key's value opens: after a key's closing quote (one not
    escaped inside a string), its colon and any space. Found with `find`, not a pattern: a
    pattern search over megabytes is one long call too."""
    at = raw.find(b'":')
    while at >= 0:
        colon = at + 1
        if at == 0 or raw[at - 1] != ord("\\"):
            begin = colon + 1
            while begin < len(raw) and raw[begin] in _SPACE:
                begin += 1
            if begin < len(raw) and raw[begin] == ord("["):
                yield begin
        at = raw.find(b'":', colon)


def _array(text: bytes, piece_bytes: int) -> list[Any]:
    """The elements of the array whose text between its brackets is `text`."""
    rows = _ROWS.match(text) is not None
    out: list[Any] = []
    start = 0
    while start < len(text):
        cut = start + piece_bytes
        end = after = len(text)
        if cut < len(text):
            if rows:
                found = _NEXT_ROW.search(text, cut)
                if found is not None:
                    end, after = found.start() + 1, found.end()
            else:
                comma = text.find(b",", cut)
                if comma >= 0:
                    end, after = comma, comma + 1
        try:
            out += json.loads(b"[" + text[start:end] + b"]")
        except (ValueError, RecursionError):
            raise _NotPieces from None
        if after == len(text) and end < after:
            raise _NotPieces  # a trailing comma: not JSON
        start = after
    return out


def _put_back(root: Any, lifted: dict[str, list[Any]]) -> Any:
    """`root` with each placeholder string replaced, in place, by its array."""
    if isinstance(root, str):
        return lifted.get(root, root)
    stack = [root]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, str):
                if value.startswith(_MARK) and value in lifted:
                    node[key] = lifted[value]
            elif isinstance(value, dict | list):
                stack.append(value)
    return root
