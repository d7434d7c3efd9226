"""Tool calls read as they are sampled: each call's name as soon as it is certain, then its
arguments as fragments of the JSON text the wire protocols write for them
(`arguments_text`, what `json.dumps(arguments, ensure_ascii=False)` gives).

The fragments are of that re-serialization, not of the model's own text: a model that spaces
its JSON otherwise (`{"a":1}`) or escapes otherwise (`\\u00e9`) still streams exactly the
prefix of the string the whole reply carries, so a harness that joins the fragments gets the
same bytes a non-streamed reply holds. Only what no continuation can change goes out: a string
character by character (an escape once it is whole), a number or literal once the character
after it ends it, an XML parameter's value once it is certain it is not its last newline.

Hermes JSON calls (`<tool_call>{"name": .., "arguments": {..}}</tool_call>`) and Qwen3-Coder /
Nemotron 3 XML calls (`<function=..><parameter=..>`) stream so. An XML parameter whose schema
says it is a string streams as sampled; any other waits for its `</parameter>` (the schema, or
its text, decides what it is). A format with a `call_end` (GLM, Kimi, DeepSeek, MiniMax) gives
each call whole once its end is sampled; the rest (Llama 3's JSON, harmony) at the end.
"""

from __future__ import annotations

import enum
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokentrail.text import formats
from tokentrail.text.formats.base import (
    JSON,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    Malformed,
    TaggedCalls,
    ToolFormat,
    ToolSchemas,
    parameter_schemas,
    schema_types,
    typed_value,
)
from tokentrail.text.json_echo import JSON_SPACE, JsonEcho, escaped

__all__ = ["CallDelta", "CallsReader", "arguments_text", "calls_reader"]


def arguments_text(arguments: Mapping[str, Any]) -> str:
    """A call's arguments as every protocol writes them on the wire (`openai.dump_arguments`
    for arguments parsed from model output)."""
    return json.dumps(arguments, ensure_ascii=False)


@dataclass
class CallDelta:
    """More of call `index`: its `name` on the call's first delta ("" after), and a fragment
    of its `arguments_text`."""

    index: int
    name: str = ""
    arguments: str = ""


def _partial(text: str, pos: int, marker: str) -> bool:
    """Whether `text[pos:]` is a proper prefix of `marker` (it may still become it)."""
    rest = text[pos:]
    return len(rest) < len(marker) and marker.startswith(rest)


_KEY = re.compile(r'"(?:[^"\\]|\\.)*"')


class CallsReader(ABC):
    """A tool format's calls read from `start` (where the first call start is) as text grows.

    `feed(text)` takes the whole output so far and returns what is newly certain. Once the text
    is something the whole parse would reject, the reader stops (`dead`): the calls it had not
    begun come with the whole parse at the end. `content_newlines`: how many of the newlines
    before the first call the format strips from the content (the rest are content).
    """

    content_newlines = 0

    def __init__(self, start: int, tools: ToolSchemas) -> None:
        self.pos = start
        self.tools = tools
        self.index = 0
        self.dead = False

    @abstractmethod
    def feed(self, text: str) -> list[CallDelta]:
        """What `text` (the output so far) makes certain."""


class TaggedReader(CallsReader):
    """`<tool_call>...</tool_call>` blocks, whitespace between them; subclasses read a body."""

    def __init__(self, start: int, tools: ToolSchemas) -> None:
        super().__init__(start, tools)
        self.in_call = False

    def feed(self, text: str) -> list[CallDelta]:
        out: list[CallDelta] = []
        try:
            while not self.dead:
                if self.in_call:
                    if not self.call_step(text, out):
                        break
                    continue
                pos = self.pos
                while pos < len(text) and text[pos].isspace():
                    pos += 1
                self.pos = pos
                if text.startswith(TOOL_CALL_OPEN, pos):
                    self.pos = pos + len(TOOL_CALL_OPEN)
                    self.in_call = True
                    self.begin()
                    continue
                if pos < len(text) and not _partial(text, pos, TOOL_CALL_OPEN):
                    raise Malformed("text after a tool call")
                break
        except Malformed:
            self.dead = True
        return out

    def end_call(self, text: str) -> bool:
        """After a call's body: whitespace, then `</tool_call>`; False while it may come."""
        pos = self.pos
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if text.startswith(TOOL_CALL_CLOSE, pos):
            self.pos = pos + len(TOOL_CALL_CLOSE)
            self.in_call = False
            self.index += 1
            return True
        if pos < len(text) and not _partial(text, pos, TOOL_CALL_CLOSE):
            raise Malformed("text after a call's body")
        self.pos = pos
        return False

    @abstractmethod
    def begin(self) -> None:
        """A call opened at `pos`."""

    @abstractmethod
    def call_step(self, text: str, out: list[CallDelta]) -> bool:
        """Read more of the open call; False when it needs more text."""


class WholeCalls(CallsReader):
    """Calls at call granularity: each goes out whole once its end marker is sampled and the
    calls so far, closed, read as the format's own parser reads them (a marker inside an
    argument reads as no more calls, and waits)."""

    def __init__(self, start: int, tools: ToolSchemas, fmt: ToolFormat, marker: str) -> None:
        super().__init__(start, tools)
        self.fmt, self.marker, self.close = fmt, marker, fmt.calls_close
        self.content_newlines = fmt.content_newlines
        self.scan = start

    def feed(self, text: str) -> list[CallDelta]:
        out: list[CallDelta] = []
        while True:
            end = text.find(self.marker, self.scan)
            if end < 0:
                self.scan = max(self.scan, len(text) - len(self.marker) + 1)
                return out
            self.scan = end + len(self.marker)
            try:
                _, calls = self.fmt.split(text[self.pos : self.scan] + self.close, self.tools)
            except Malformed:
                continue
            for call in calls[self.index :]:
                fn = call["function"]
                out.append(CallDelta(self.index, fn["name"], arguments_text(fn["arguments"])))
                self.index += 1


class _Hermes(enum.Enum):
    """Where a Hermes call's reader is: what it reads next."""

    OPEN = "open"  # the call's `{`
    KEY = "key"  # a key, or the `}`
    COLON = "colon"
    BEFORE_VALUE = "before_value"  # the value's first character
    VALUE = "value"  # inside the value
    AFTER = "after"  # a comma, or the `}`
    CLOSE = "close"  # the `</tool_call>`


class HermesCalls(TaggedReader):
    """`{"name": NAME, "arguments": {...}}` in each block: the arguments object is echoed as
    it is sampled once the name is known (arguments written before the name wait for it)."""

    def begin(self) -> None:
        self.state = _Hermes.OPEN
        self.key: str | None = None
        self.value: JsonEcho | None = None
        self.value_text: list[str] = []
        self.name: str | None = None
        self.started = False
        self.args_seen = False
        self.held: list[str] = []  # arguments read before the name

    def _emit(self, out: list[CallDelta], name: str, fragment: str) -> None:
        if name or fragment:
            out.append(CallDelta(self.index, name, fragment))

    def call_step(self, text: str, out: list[CallDelta]) -> bool:
        if self.state is _Hermes.CLOSE:
            return self.end_call(text)
        if self.state is _Hermes.VALUE:
            assert self.value is not None
            piece = self.value.feed(text)
            streaming = self.key == "arguments" and not self.args_seen
            if streaming:
                if self.started:
                    self._emit(out, "", piece)
                else:
                    self.held.append(piece)
            else:
                self.value_text.append(piece)
            if not self.value.done:
                return False
            self.pos = self.value.pos
            if streaming:
                self.args_seen = True
            elif self.key == "name":
                name = JSON.decode("".join(self.value_text))
                if not isinstance(name, str) or not name:
                    raise Malformed("a call without a name")
                if self.name is not None:
                    raise Malformed("a name given twice")  # the whole parse keeps the last one
                self.name = name
                self.started = True
                self._emit(out, name, "".join(self.held))
            self.state = _Hermes.AFTER
            return True
        pos = self.pos
        while pos < len(text) and (
            text[pos] in JSON_SPACE or (self.state is _Hermes.OPEN and text[pos].isspace())
        ):
            pos += 1
        self.pos = pos
        if pos >= len(text):
            return False
        ch = text[pos]
        if self.state is _Hermes.OPEN:
            if ch != "{":
                raise Malformed("a call that is not a JSON object")
            self.state, self.pos = _Hermes.KEY, pos + 1
            return True
        if self.state is _Hermes.KEY or self.state is _Hermes.AFTER:
            if ch == "}":
                if self.name is None:
                    raise Malformed("a call without a name")
                if not self.args_seen:
                    self._emit(out, "", "{}")
                self.state, self.pos = _Hermes.CLOSE, pos + 1
                return True
            if self.state is _Hermes.AFTER:
                if ch != ",":
                    raise Malformed("expected ','")
                self.state, self.pos = _Hermes.KEY, pos + 1
                return True
            match = _KEY.match(text, pos)
            if match is None:
                if ch != '"':
                    raise Malformed("expected a key")
                return False
            try:
                self.key = JSON.decode(match.group())
            except ValueError:
                raise Malformed("a bad key") from None
            self.state, self.pos = _Hermes.COLON, match.end()
            return True
        if self.state is _Hermes.COLON:
            if ch != ":":
                raise Malformed("expected ':'")
            self.state, self.pos = _Hermes.BEFORE_VALUE, pos + 1
            return True
        if self.state is _Hermes.BEFORE_VALUE:
            if self.key == "arguments" and not self.args_seen and ch != "{":
                raise Malformed("arguments that are not an object")
            self.value, self.value_text = JsonEcho(pos), []
            self.state = _Hermes.VALUE
            return True
        raise AssertionError(self.state)


_FUNCTION_NAME = re.compile(r"\s*<function=([^>\n]*)>")
_FUNCTION_PREFIX = re.compile(r"\s*(<(f(u(n(c(t(i(o(n(=[^>\n]*)?)?)?)?)?)?)?)?)?)?\Z")
_PARAMETER_OPEN = "<parameter="
_PARAMETER_CLOSE = "</parameter>"
_FUNCTION_CLOSE = "</function>"


class _Xml(enum.Enum):
    """Where an XML call's reader is: what it reads next."""

    FUNCTION = "function"  # the `<function=NAME>` tag
    PARAMETERS = "parameters"  # a `<parameter=KEY>` tag or the `</function>`
    VALUE = "value"  # a parameter's value, up to its `</parameter>`
    CLOSE = "close"  # the `</tool_call>`


class XmlCalls(TaggedReader):
    """`<function=NAME>` then `<parameter=KEY>\\nVALUE\\n</parameter>` each: a string
    parameter (by its schema) streams as JSON-escaped text, any other goes out whole when its
    `</parameter>` is sampled."""

    def begin(self) -> None:
        self.state = _Xml.FUNCTION
        self.schemas: Mapping[str, Any] = {}
        self.count = 0
        self.seen: set[str] = set()
        self.key = ""
        self.streams = False
        self.value_start = 0
        self.searched = 0
        self.sent = 0

    def call_step(self, text: str, out: list[CallDelta]) -> bool:
        if self.state is _Xml.CLOSE:
            return self.end_call(text)
        if self.state is _Xml.FUNCTION:
            match = _FUNCTION_NAME.match(text, self.pos)
            if match is None:
                if _FUNCTION_PREFIX.match(text, self.pos):
                    return False
                raise Malformed("a call that is not <function=NAME>")
            name = match.group(1)
            if not name.strip():
                raise Malformed("a call without a name")
            self.schemas = parameter_schemas(self.tools, name)
            out.append(CallDelta(self.index, name, ""))
            self.state, self.pos = _Xml.PARAMETERS, match.end()
            return True
        if self.state is _Xml.VALUE:
            return self._value(text, out)
        pos = self.pos
        while pos < len(text) and text[pos].isspace():
            pos += 1
        self.pos = pos
        if text.startswith(_FUNCTION_CLOSE, pos):
            out.append(CallDelta(self.index, "", "}" if self.count else "{}"))
            self.state, self.pos = _Xml.CLOSE, pos + len(_FUNCTION_CLOSE)
            return True
        if text.startswith(_PARAMETER_OPEN, pos):
            name_end = text.find(">", pos)
            newline = text.find("\n", pos)
            if name_end < 0 and newline < 0:
                return False
            key = text[pos + len(_PARAMETER_OPEN) : name_end] if name_end >= 0 else ""
            if name_end < 0 or not key or "\n" in key:
                raise Malformed("a bad <parameter=NAME> tag")
            if key in self.seen:
                raise Malformed("a parameter given twice")
            self.seen.add(key)
            self.key = key
            self.streams = schema_types(self.schemas.get(key)) == {"string"}
            head = ("{" if not self.count else ", ") + json.dumps(key, ensure_ascii=False) + ": "
            self.count += 1
            out.append(CallDelta(self.index, "", head + ('"' if self.streams else "")))
            self.value_start = self.sent = name_end + 1
            self.state, self.pos = _Xml.VALUE, name_end + 1
            return True
        if pos < len(text) and not (
            _partial(text, pos, _PARAMETER_OPEN) or _partial(text, pos, _FUNCTION_CLOSE)
        ):
            raise Malformed("unexpected text in a function")
        return False

    def _value(self, text: str, out: list[CallDelta]) -> bool:
        # Searched from where the last search could not have missed a close: linear in all.
        close = text.find(_PARAMETER_CLOSE, max(self.value_start, self.searched))
        self.searched = 0 if close >= 0 else len(text) - len(_PARAMETER_CLOSE) + 1
        start = self.value_start
        if start < len(text) and text[start] == "\n" and self.sent == start:
            self.sent = start + 1  # the one newline after the tag is layout
        elif start >= len(text):
            return False
        if close < 0:
            if self.streams:
                stop = len(text)
                for k in range(min(len(_PARAMETER_CLOSE) - 1, len(text) - start), 0, -1):
                    if text.endswith(_PARAMETER_CLOSE[:k]):
                        stop -= k
                        break
                if stop > self.sent and text[stop - 1] == "\n":
                    stop -= 1  # the newline before `</parameter>` is layout, if it is one
                if stop > self.sent:
                    out.append(CallDelta(self.index, "", escaped(text[self.sent : stop])))
                    self.sent = stop
            return False
        end = close - 1 if close > self.sent and text[close - 1] == "\n" else close
        if self.streams:
            tail = escaped(text[self.sent : end]) if end > self.sent else ""
            out.append(CallDelta(self.index, "", tail + '"'))
        else:
            raw = text[self.sent : max(end, self.sent)]
            value = typed_value(raw, schema_types(self.schemas.get(self.key)))
            out.append(CallDelta(self.index, "", json.dumps(value, ensure_ascii=False)))
        self.state, self.pos = _Xml.PARAMETERS, close + len(_PARAMETER_CLOSE)
        return True


# Formats whose calls stream as sampled; the others with a `call_end` go out call by call.
_READERS: dict[str, type[TaggedReader]] = {
    "hermes": HermesCalls,
    "qwen3_coder": XmlCalls,
    "nemotron3": XmlCalls,
}


def calls_reader(tool_parser: str, start: int, tools: ToolSchemas) -> CallsReader | None:
    """The reader for `tool_parser`'s calls from `start`, or None (calls come at the end)."""
    tagged = _READERS.get(tool_parser)
    if tagged is not None:
        reader = tagged(start, tools)
        tagged_fmt = formats.tool_format(tool_parser)
        assert isinstance(tagged_fmt, TaggedCalls)
        reader.content_newlines = len(tagged_fmt.content_to_call)
        return reader
    fmt = formats.tool_format(tool_parser)
    if fmt.call_end is None:
        return None
    return WholeCalls(start, tools, fmt, fmt.call_end)
