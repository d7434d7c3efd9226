"""One JSON value read as it is sampled and written back as `json.dumps` writes it.

`JsonEcho` gives, of a prefix of a model's JSON text, the prefix of its re-serialization that no
continuation can change: a string character by character (an escape once it is whole), a number
or literal once the character after it ends it. `text.stream_calls` streams Hermes call
arguments with it.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass

from tokentrail.text.formats.base import JSON, Malformed

__all__ = ["JSON_SPACE", "JsonEcho", "escaped"]


def escaped(text: str) -> str:
    """`text` as it stands inside a JSON string `json.dumps` writes."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


JSON_SPACE = " \t\n\r"
_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')
_SCALAR = re.compile(r"[-+0-9.eEa-zA-Z]+")
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_SIMPLE_ESCAPES = {
    '"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"
}  # fmt: skip


class _Json(enum.Enum):
    """What comes next in an open JSON container (or, with none open, a value)."""

    FIRST = "first"  # the first key or item, or the close of an empty container
    KEY = "key"  # a key (or, in an array, an item) after a comma
    COLON = "colon"
    VALUE = "value"
    AFTER = "after"  # a comma or the close


@dataclass(slots=True)
class _Container:
    kind: str  # "{" or "["
    next: _Json


class JsonEcho:
    """One JSON value read incrementally from `pos`, written back as `json.dumps` writes it.

    `feed(text)` reads what it can of `text[pos:]` and returns the canonical text of it that is
    certain; `done` once the value is whole (`pos` is then just after it). Raises `Malformed` for
    text that is not JSON.
    """

    def __init__(self, pos: int) -> None:
        self.pos = pos
        self.stack: list[_Container] = []  # the open containers, innermost last
        self.in_string = False
        self.done = False

    def feed(self, text: str) -> str:
        out: list[str] = []
        while not self.done:
            if not self._step(text, out):
                break
        return "".join(out)

    def _value_done(self) -> None:
        if self.stack:
            self.stack[-1].next = _Json.AFTER
        else:
            self.done = True

    def _step(self, text: str, out: list[str]) -> bool:
        """One step; False when it needs more text."""
        pos = self.pos
        if self.in_string:
            return self._string(text, out)
        while pos < len(text) and text[pos] in JSON_SPACE:
            pos += 1
        self.pos = pos
        if pos >= len(text):
            return False
        ch = text[pos]
        state = self.stack[-1].next if self.stack else _Json.VALUE
        if state is _Json.COLON:
            if ch != ":":
                raise Malformed("expected ':'")
            out.append(": ")
            self.stack[-1].next = _Json.VALUE
            self.pos = pos + 1
            return True
        if state is _Json.AFTER:
            kind = self.stack[-1].kind
            close = "}" if kind == "{" else "]"
            if ch == ",":
                out.append(", ")
                self.stack[-1].next = _Json.KEY if kind == "{" else _Json.VALUE
            elif ch == close:
                out.append(close)
                self.stack.pop()
                self._value_done()
            else:
                raise Malformed("expected ',' or a close")
            self.pos = pos + 1
            return True
        if state is _Json.FIRST or state is _Json.KEY:
            kind = self.stack[-1].kind
            if state is _Json.FIRST and ch == ("}" if kind == "{" else "]"):
                out.append(ch)
                self.stack.pop()
                self.pos = pos + 1
                self._value_done()
                return True
            if kind == "{":
                if ch != '"':
                    raise Malformed("expected a key")
                self.stack[-1].next = _Json.COLON
                out.append('"')
                self.in_string = True
                self.pos = pos + 1
                return True
            self.stack[-1].next = _Json.VALUE
            return True
        # A value.
        if ch in "{[":
            out.append(ch)
            self.stack.append(_Container(ch, _Json.FIRST))
            self.pos = pos + 1
            return True
        if ch == '"':
            out.append('"')
            self.in_string = True
            self.pos = pos + 1
            return True
        match = _SCALAR.match(text, pos)
        if match is None:
            raise Malformed("not a JSON value")
        if match.end() == len(text):
            return False  # a number or literal that may go on
        try:
            value = JSON.decode(match.group())
        except ValueError:
            raise Malformed("not a JSON value") from None
        out.append(json.dumps(value, ensure_ascii=False))
        self.pos = match.end()
        self._value_done()
        return True

    def _string(self, text: str, out: list[str]) -> bool:
        pos = self.pos
        plain = _PLAIN.match(text, pos)
        if plain is not None:
            out.append(plain.group())
            self.pos = pos = plain.end()
        if pos >= len(text):
            return False
        ch = text[pos]
        if ch == '"':
            out.append('"')
            self.in_string = False
            self.pos = pos + 1
            if self.stack and self.stack[-1].next is _Json.COLON:
                return True  # a key: its colon comes next
            self._value_done()
            return True
        if ch != "\\":
            raise Malformed("a control character in a string")
        if pos + 1 >= len(text):
            return False
        kind = text[pos + 1]
        if kind in _SIMPLE_ESCAPES:
            out.append(escaped(_SIMPLE_ESCAPES[kind]))
            self.pos = pos + 2
            return True
        if kind != "u":
            raise Malformed("a bad escape")
        if len(text) < pos + 6:
            if not _HEX4.match(text[pos + 2 :].ljust(4, "0")):
                raise Malformed("a bad \\u escape")
            return False
        if not _HEX4.fullmatch(text, pos + 2, pos + 6):
            raise Malformed("a bad \\u escape")
        code = int(text[pos + 2 : pos + 6], 16)
        end = pos + 6
        if 0xD800 <= code <= 0xDBFF:
            # A high surrogate joins a `\uDC00`-`\uDFFF` right after it (as json does).
            follow = text[end : end + 6]
            if len(follow) < 6 and "\\u".startswith(follow[:2]):
                return False  # what follows may still be one
            if follow[:2] == "\\u" and _HEX4.fullmatch(follow, 2, 6):
                low = int(follow[2:], 16)
                if 0xDC00 <= low <= 0xDFFF:
                    code = 0x10000 + (((code - 0xD800) << 10) | (low - 0xDC00))
                    end += 6
        out.append(escaped(chr(code)))
        self.pos = end
        return True
