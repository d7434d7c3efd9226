"""Reference of `_core.index_body` and `_core.diff_bodies`: where a request body's top-level
fields and its array field's elements lie, and what changed between two bodies.

The same scan as the core's, byte by byte: the structure is checked (UTF-8, strings, brackets,
separators, one object at the top), each value is kept as opaque bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokentrail.errors import BodyShapeError

__all__ = ["BodyIndex", "diff_bodies", "index_body"]

_WS = b" \t\n\r"
_DELIMITERS = b',]}:"[{' + _WS
_SURROGATE_LEAD = b"89abcdefABCDEF"


@dataclass
class BodyIndex:
    fields: list[tuple[str, int, int]] = field(default_factory=list)
    array_field: int | None = None
    elements: list[tuple[int, int]] = field(default_factory=list)
    depth: int = 1
    structural: int = 0
    surrogate_escape: bool = False

    def __len__(self) -> int:
        return len(self.elements)

    def elements_from(self, start: int) -> list[tuple[int, int]]:
        return self.elements[start:]


def index_body(
    body: bytes, array: str, previous: tuple[bytes, BodyIndex] | None = None
) -> BodyIndex:
    """Index `body`; `BodyShapeError` when the scan does not take it. `previous` (the
    session's previous body and its index) is what the core resumes from; the reference
    scans the whole body, to the same result."""
    del previous
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyShapeError("the body is not UTF-8") from None
    return _Scan(body).top(array.encode())


def diff_bodies(
    old_body: bytes, old: BodyIndex, new_body: bytes, new: BodyIndex
) -> tuple[list[int], int]:
    """The positions in `new.fields` whose values differ from `old`'s (or that `old` lacks),
    and the first element of the array that differs."""
    was = {key: (start, end) for key, start, end in old.fields}
    changed = []
    for pos, (key, start, end) in enumerate(new.fields):
        if key not in was:
            changed.append(pos)
        elif pos == new.array_field and old.array_field is not None:
            continue
        elif old_body[slice(*was[key])] != new_body[start:end]:
            changed.append(pos)
    first = 0
    if old.array_field is not None:
        for (a, b), (c, d) in zip(old.elements, new.elements, strict=False):
            if old_body[a:b] != new_body[c:d]:
                break
            first += 1
    return changed, first


class _Scan:
    def __init__(self, body: bytes) -> None:
        self.b = body
        self.out = BodyIndex()

    def fail(self, at: int) -> BodyShapeError:
        return BodyShapeError(f"not a JSON object at byte {at}")

    def ws(self, i: int) -> int:
        while i < len(self.b) and self.b[i] in _WS:
            i += 1
        return i

    def expect(self, i: int, char: bytes) -> int:
        if self.b[i : i + 1] != char:
            raise self.fail(i)
        return i + 1

    def top(self, array: bytes) -> BodyIndex:
        out = self.out
        i = self.expect(self.ws(0), b"{")
        out.structural += 1
        i = self.ws(i)
        if self.b[i : i + 1] == b"}":
            return self.end(i + 1)
        while True:
            key_start = i
            key_end = self.string(i)
            raw_key = self.b[key_start + 1 : key_end - 1]
            if b"\\" in raw_key:
                raise BodyShapeError(f"a top-level key at byte {key_start} has escapes")
            key = raw_key.decode()
            if any(k == key for k, _, _ in out.fields):
                raise BodyShapeError(f"the top-level key {key!r} is repeated")
            i = self.ws(self.expect(self.ws(key_end), b":"))
            start = i
            if raw_key == array and self.b[i : i + 1] == b"[":
                out.array_field = len(out.fields)
                i = self.array(i)
            else:
                i = self.value(i, 1)
            out.fields.append((key, start, i))
            i = self.ws(i)
            sep = self.b[i : i + 1]
            if sep == b",":
                out.structural += 1
                i = self.ws(i + 1)
            elif sep == b"}":
                return self.end(i + 1)
            else:
                raise self.fail(i)

    def end(self, i: int) -> BodyIndex:
        if self.ws(i) != len(self.b):
            raise self.fail(self.ws(i))
        return self.out

    def array(self, i: int) -> int:
        self.out.structural += 1
        self.out.depth = max(self.out.depth, 2)
        i = self.ws(i + 1)
        if self.b[i : i + 1] == b"]":
            return i + 1
        while True:
            start = i
            i = self.value(i, 2)
            self.out.elements.append((start, i))
            i = self.ws(i)
            sep = self.b[i : i + 1]
            if sep == b",":
                self.out.structural += 1
                i = self.ws(i + 1)
            elif sep == b"]":
                return i + 1
            else:
                raise self.fail(i)

    def value(self, i: int, depth: int) -> int:
        head = self.b[i : i + 1]
        if not head:
            raise self.fail(i)
        if head == b'"':
            return self.string(i)
        if head in (b"{", b"["):
            return self.container(i, depth)
        j = i
        while j < len(self.b) and self.b[j] not in _DELIMITERS:
            j += 1
        if j == i:
            raise self.fail(i)
        return j

    def string(self, i: int) -> int:
        if self.b[i : i + 1] != b'"':
            raise self.fail(i)
        j = i + 1
        while True:
            if j >= len(self.b):
                raise self.fail(i)
            c = self.b[j]
            if c == ord('"'):
                return j + 1
            if c == ord("\\"):
                esc = self.b[j + 1 : j + 4]
                if len(esc) == 3 and esc[0:1] == b"u" and esc[1:2] in (b"d", b"D"):
                    if esc[2] in _SURROGATE_LEAD:
                        self.out.surrogate_escape = True
                if j + 1 >= len(self.b):
                    raise self.fail(j)
                j += 2
            else:
                j += 1

    def container(self, i: int, depth: int) -> int:
        open_: list[int] = []
        j = i
        while j < len(self.b):
            c = self.b[j]
            if c == ord('"'):
                j = self.string(j)
                continue
            if c in b"{[":
                open_.append(ord("}") if c == ord("{") else ord("]"))
                self.out.structural += 1
                self.out.depth = max(self.out.depth, depth + len(open_))
            elif c in b"}]":
                if not open_ or open_.pop() != c:
                    raise self.fail(j)
                if not open_:
                    return j + 1
            elif c == ord(","):
                self.out.structural += 1
            j += 1
        raise self.fail(i)
