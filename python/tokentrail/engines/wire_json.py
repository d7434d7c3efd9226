"""An engine's JSON answer decoded without holding the interpreter for long, or filling the heap
with one object per token.

A long turn's answer is megabytes of small numbers (SGLang's `output_token_logprobs` entries,
`output_ids`, vLLM's `token_logprobs`): one `json.loads` over it is one C call that holds the
GIL, and the event loop waiting for it, for a tenth of a second; and SGLang's entries are one
list per token, each a container the garbage collector walks (40 such answers in flight made
every full collection take half a second). `loads_in_pieces` parses each long array of numbers
a piece at a time, and an array of equally long rows of numbers into `Rows`: the values flat in
one list, a row made only when asked for. The Rust core reads such an array whole with the
GIL let go (`number_array`); an array it does not take, or every array with the Python
backend, is parsed here a piece at a time. The rest of the answer, small once they are out, is
parsed in one call. An array is split only between its elements, and any piece that does not
parse sends the whole answer to `json.loads`, which names what is wrong.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

from tokentrail.core.backend import load_backend
from tokentrail.kinds import Backend

__all__ = ["PIECE_BYTES", "Rows", "loads_in_pieces", "put_back"]

# Arrays are parsed this many bytes at a time (about a millisecond of parsing each).
PIECE_BYTES = 32 * 1024
# What may lie between a key and its value.
_SPACE = b" \t\r\n"
# Where the next element of an array of arrays begins: after a `]` and its comma.
_NEXT_ROW = re.compile(rb"\]\s*,")
# An array of arrays: split after an element.
_NESTED = re.compile(rb"\s*\[")
# The first element of an array of arrays (of rows): its text between brackets.
_FIRST_ROW = re.compile(rb"\s*\[([^\[\]]*)\]")
# What a lifted array stands as while the rest of the answer is parsed.
_MARK = "\0tokentrail-array-"


class _NotPieces(Exception):
    """An array that does not split into pieces that parse: the whole answer is parsed."""


class Rows(Sequence[list[Any]]):
    """An array of rows of `width` scalars each, held flat in `values`. It reads as the list of
    lists `json.loads` makes (indexing, iterating, `==`), each row made when asked for;
    `column(k)` is the `k`-th value of every row, without making any row. `types`, when
    known (the Rust core's reading), is the one type of every value of each column (None
    where they differ)."""

    __slots__ = ("types", "values", "width")

    def __init__(
        self, width: int, values: list[Any], types: Sequence[type | None] | None = None
    ) -> None:
        self.width = width
        self.values = values
        self.types = types

    def column(self, k: int) -> list[Any]:
        return self.values[k :: self.width]

    def __len__(self) -> int:
        return len(self.values) // self.width

    @overload
    def __getitem__(self, index: int) -> list[Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[list[Any]]: ...
    def __getitem__(self, index: int | slice) -> list[Any] | list[list[Any]]:
        if isinstance(index, slice):
            return [self[k] for k in range(*index.indices(len(self)))]
        n = len(self)
        if not -n <= index < n:
            raise IndexError("row index out of range")
        start = (index % n) * self.width
        return self.values[start : start + self.width]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Rows):
            return self.width == other.width and self.values == other.values
        return isinstance(other, list) and list(self) == other

    __hash__ = None  # type: ignore[assignment]  # a list does not hash either

    def __repr__(self) -> str:
        return f"Rows(width={self.width}, rows={len(self)})"


def loads_in_pieces(raw: bytes | bytearray, piece_bytes: int = PIECE_BYTES) -> Any:
    """`json.loads(raw.decode("utf-8"))`, with every array value of more than `piece_bytes`
    that holds no string parsed `piece_bytes` at a time."""
    nonce = secrets.token_hex(8)
    view = memoryview(raw)
    parts: list[bytes | memoryview] = []
    lifted: dict[str, list[Any] | Rows] = {}
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


def _array(text: bytes, piece_bytes: int) -> list[Any] | Rows:
    """The elements of the array whose text between its brackets is `text`: a `Rows` when
    every element is a row of as many scalars as the first. The Rust core reads an array of
    numbers, or of rows of them, with the interpreter let go; the rest (and every array, with
    the Python backend) is parsed here a piece at a time."""
    core = load_backend()
    if core.backend is Backend.RUST:
        flat = core.number_array(text)
        if flat is not None:
            width, values, types = flat
            return Rows(width, values, types) if width else values
    return _array_in_pieces(text, piece_bytes)


def _array_in_pieces(text: bytes, piece_bytes: int) -> list[Any] | Rows:
    """`_array`, in Python: `piece_bytes` at a time."""
    nested = _NESTED.match(text) is not None
    width = _row_width(text) if nested else None
    row = None if width is None else _row_pattern(width)
    out: list[Any] = []
    start = 0
    while start < len(text):
        cut = start + piece_bytes
        end = after = len(text)
        if cut < len(text):
            if nested:
                found = _NEXT_ROW.search(text, cut)
                if found is not None:
                    end, after = found.start() + 1, found.end()
            else:
                comma = text.find(b",", cut)
                if comma >= 0:
                    end, after = comma, comma + 1
        piece = text[start:end]
        if row is not None and row.fullmatch(piece) is None:
            row = None
            out = _as_lists(out, width)
        try:
            if row is not None:
                # Rows of scalars only: their values, flat, with no list per row.
                out += json.loads(b"[" + piece.replace(b"[", b"").replace(b"]", b"") + b"]")
            else:
                out += json.loads(b"[" + piece + b"]")
        except (ValueError, RecursionError):
            raise _NotPieces from None
        if after == len(text) and end < after:
            raise _NotPieces  # a trailing comma: not JSON
        start = after
    if row is not None and width is not None:
        return Rows(width, out)
    return out


def _row_width(text: bytes) -> int | None:
    """How many values the array's first element holds, when it is a row (an array)."""
    first = _FIRST_ROW.match(text)
    if first is None:
        return None
    inside = first.group(1)
    return inside.count(b",") + 1 if inside.strip() else None


def _row_pattern(width: int) -> re.Pattern[bytes]:
    """A piece of rows of `width` scalars each (no nested array; the span holds no string)."""
    one = rb"\[[^,\[\]]*" + rb",[^,\[\]]*" * (width - 1) + rb"\]"
    return re.compile(rb"\s*" + one + rb"(?:\s*,\s*" + one + rb")*\s*")


def _as_lists(flat: list[Any], width: int | None) -> list[Any]:
    """Rows parsed flat so far, as lists again (a later row is not like them)."""
    if not width:
        return flat
    return [flat[at : at + width] for at in range(0, len(flat), width)]


def _put_back(root: Any, lifted: dict[str, list[Any] | Rows]) -> Any:
    """`root` with each placeholder string replaced, in place, by its array."""
    if isinstance(root, str):
        return lifted.get(root, root)
    put_back(root, lifted, _MARK)
    return root


def put_back(root: Any, values: Mapping[str, object], mark: str) -> int:
    """Replace, in place, each string of the parsed JSON `root` (a dict or a list) that
    begins with `mark` and is a key of `values` by its value; how many were replaced."""
    found = 0
    stack = [root] if isinstance(root, dict | list) else []
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, str):
                if value.startswith(mark) and value in values:
                    node[key] = values[value]
                    found += 1
            elif isinstance(value, dict | list):
                stack.append(value)
    return found
