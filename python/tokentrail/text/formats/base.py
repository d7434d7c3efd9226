"""What every output format shares: the two registries and the helpers formats parse with.

A *tool format* reads and writes a model family's tool-call markup (`hermes`, `kimi_k2`, ...);
a *reasoning format* reads and writes the way it wraps its reasoning around the rest of its
output (`qwen3`, `glm45`, ...). Each registers under the name `--tool-parser` and
`--reasoning-parser` take, so a new family is a new module, not a new branch. `TaggedCalls` is
the shared base of the formats that write each call in a `<tool_call>` block (Hermes,
Qwen3-Coder, GLM).
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from tokentrail.errors import OutputFormatError
from tokentrail.kinds import REASONING_FIELDS
from tokentrail.messages import Message, ToolCall

ToolSchemas = Sequence[Mapping[str, Any]] | None


class Malformed(Exception):
    """Model output a format cannot read; `parse_output` turns it into an ill-formed result."""


class ToolFormat(ABC):
    """One family's tool-call markup: where calls start, how to read and write them."""

    name: ClassVar[str]
    # The text that opens a message's calls; a `</think>` after it is argument data.
    call_start: ClassVar[str]
    # Where one call ends and what closes the calls so far: a stream reads each call whole
    # once its end is sampled (`text.stream_calls`); None: its calls are read at the end.
    call_end: ClassVar[str | None] = None
    calls_close: ClassVar[str] = ""
    # How many of the newlines before the first call `split` strips from the content.
    content_newlines: ClassVar[int] = 0

    def has_calls(self, text: str) -> bool:
        return self.call_start in text

    @abstractmethod
    def split(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall]]:
        """The content before the calls, and the calls; raises `Malformed`."""

    @abstractmethod
    def write(
        self, content: str, calls: Sequence[Mapping[str, Any]], *, call_index: int, compact: bool
    ) -> str:
        """The text a model writes for `content` then `calls` (what a reasoning format wraps).

        `call_index` is how many calls the conversation held before these (Kimi numbers its
        calls); `compact` writes JSON without spaces, as models sometimes do.
        """

    def write_message(
        self,
        message: Mapping[str, Any],
        reasoning: ReasoningFormat | None,
        *,
        opened: bool,
        call_index: int,
        compact: bool,
    ) -> str:
        """The text a model writes for `message`: its reasoning wrapped around the body."""
        body = self.write(
            text_of(message.get("content")),
            message.get("tool_calls") or (),
            call_index=call_index,
            compact=compact,
        )
        if reasoning is None:
            return body
        return reasoning.wrap(reasoning_of(message), body, opened=opened)


class MessageFormat(ToolFormat):
    """A format that reads the whole output itself, reasoning included (harmony): its reasoning
    is no reasoning format's to split off."""

    @abstractmethod
    def parse_message(self, text: str, reasoning: bool, tools: ToolSchemas) -> Message:
        """The whole message; `reasoning`: a reasoning parser was named. Raises `Malformed`."""


TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


def expect_close(text: str, pos: int, what: str) -> int:
    """Index after the `</tool_call>` that must follow `pos` (whitespace allowed)."""
    pos = skip_space(text, pos)
    if text.startswith(TOOL_CALL_CLOSE, pos):
        return pos + len(TOOL_CALL_CLOSE)
    if TOOL_CALL_CLOSE not in text[pos:]:
        raise Malformed("unclosed <tool_call>")
    raise Malformed(f"unexpected text after {what}")


class TaggedCalls(ToolFormat):
    """Calls in `<tool_call>...</tool_call>` blocks; subclasses read and write one block."""

    call_start = TOOL_CALL_OPEN
    # The newlines a template puts between non-empty content and the first call.
    content_to_call = "\n"

    def split(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall]]:
        first = text.index(TOOL_CALL_OPEN)
        content = strip_newlines(text[:first], 0, len(self.content_to_call))
        calls: list[ToolCall] = []
        pos = first
        while True:
            # Each call is read by its own grammar up to its closing tag, not cut at the first
            # `</tool_call>`: an argument may well contain tool-call markup.
            call, pos = self.read_call(text, pos + len(TOOL_CALL_OPEN), tools)
            calls.append(call)
            following = text.find(TOOL_CALL_OPEN, pos)
            between = text[pos:] if following < 0 else text[pos:following]
            if between.strip():
                # A message has no place for text after its calls; re-rendering would move it.
                raise Malformed("text after a tool call")
            if following < 0:
                return content, calls
            pos = following

    @abstractmethod
    def read_call(self, text: str, pos: int, tools: ToolSchemas) -> tuple[ToolCall, int]:
        """The call whose `<tool_call>` ends at `pos`, and the index after its closing tag."""

    def write(
        self, content: str, calls: Sequence[Mapping[str, Any]], *, call_index: int, compact: bool
    ) -> str:
        parts = [content]
        for i, call in enumerate(calls):
            if i:
                parts.append("\n")
            elif content:
                parts.append(self.content_to_call)
            parts.append(self.write_call(call, compact))
        return "".join(parts)

    @abstractmethod
    def write_call(self, call: Mapping[str, Any], compact: bool) -> str:
        """The text of one call, its `<tool_call>` tags included."""


class ReasoningFormat(ABC):
    """How a family wraps its reasoning around the rest of what it writes (the body)."""

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def split(self, text: str, call_start: str | None) -> tuple[str | None, str]:
        """The reasoning (None when there is none) and the body; raises `Malformed`."""

    @abstractmethod
    def wrap(self, reasoning: str | None, body: str, *, opened: bool) -> str:
        """The text of `reasoning` then `body`; `opened`: the prompt already opened the
        reasoning block (its generation prompt ends with `<think>`)."""


_TOOL_FORMATS: dict[str, ToolFormat] = {}
_REASONING_FORMATS: dict[str, ReasoningFormat] = {}
T = TypeVar("T", bound=type[ToolFormat])
Item = TypeVar("Item")


def register_tool_format(cls: T) -> T:
    """Class decorator: make a tool format available under its `name`."""
    _TOOL_FORMATS[cls.name] = cls()
    return cls


def register_reasoning_format(fmt: ReasoningFormat) -> ReasoningFormat:
    """Make a reasoning format available under its name."""
    _REASONING_FORMATS[fmt.name] = fmt
    return fmt


def tool_format(name: str) -> ToolFormat:
    try:
        return _TOOL_FORMATS[name]
    except KeyError:
        known = ", ".join(sorted(_TOOL_FORMATS))
        raise OutputFormatError(f"unknown tool parser {name!r}; known: {known}") from None


def reasoning_format(name: str) -> ReasoningFormat:
    try:
        return _REASONING_FORMATS[name]
    except KeyError:
        known = ", ".join(sorted(_REASONING_FORMATS))
        raise OutputFormatError(f"unknown reasoning parser {name!r}; known: {known}") from None


def tool_format_names() -> list[str]:
    return sorted(_TOOL_FORMATS)


def reasoning_format_names() -> list[str]:
    return sorted(_REASONING_FORMATS)


# --- helpers ------------------------------------------------------------------------------------


# Where a message's reasoning may live; the first found wins (as in chat_template.render).
def reasoning_of(message: Mapping[str, Any]) -> str | None:
    return next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)


def make_call(name: str, arguments: dict[str, Any]) -> ToolCall:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def read_items(
    text: str, pos: int, end: str, read_item: Callable[[int], tuple[Item, int] | None], where: str
) -> tuple[list[Item], int]:
    """The items from `pos` up to the `end` tag, whitespace between them skipped, and the
    index after `end`. `read_item(pos)` reads the item starting at `pos` and returns it with
    the index after it, or None when none starts there; `where` names the enclosing section in
    errors."""
    items: list[Item] = []
    while True:
        pos = skip_space(text, pos)
        if text.startswith(end, pos):
            return items, pos + len(end)
        if pos >= len(text):
            raise Malformed(f"unclosed {where}")
        read = read_item(pos)
        if read is None:
            raise Malformed(f"unexpected text in {where}")
        item, pos = read
        items.append(item)


def section_calls(
    text: str,
    pos: int,
    end: str,
    read_call: Callable[[int], tuple[ToolCall, int] | None],
    where: str,
) -> list[ToolCall]:
    """The calls of a tool-call section whose opening tag ends at `pos` (`read_items`): at
    least one, and nothing but whitespace after the section."""
    calls, pos = read_items(text, pos, end, read_call, where)
    if text[pos:].strip():
        raise Malformed("text after the tool calls")
    if not calls:
        raise Malformed(f"an empty {where}")
    return calls


def read_parameters(
    text: str,
    pos: int,
    opening: re.Pattern[str],
    closing: str,
    end: str,
    where: str,
    value: Callable[[re.Match[str], str], Any],
) -> tuple[dict[str, Any], int]:
    """Parameters written `<opening>raw<closing>` from `pos` up to the `end` tag
    (`read_items`), and the index after it: each one's key is the opening match's first
    group, its value `value(match, raw)`. A key given twice is refused."""
    arguments: dict[str, Any] = {}

    def read(at: int) -> tuple[str, int] | None:
        match = opening.match(text, at)
        if match is None:
            return None
        key = match.group(1)
        close = text.find(closing, match.end())
        if close < 0:
            raise Malformed(f"unclosed parameter {key!r}")
        if key in arguments:
            raise Malformed(f"parameter {key!r} given twice")
        arguments[key] = value(match, text[match.end() : close])
        return key, close + len(closing)

    _, pos = read_items(text, pos, end, read, where)
    return arguments, pos


def strip_newlines(text: str, lead: int, trail: int) -> str:
    """`text` less at most `lead` leading and `trail` trailing newlines."""
    start = 0
    while start < lead and text.startswith("\n", start):
        start += 1
    end = len(text)
    while len(text) - end < trail and end > start and text[end - 1] == "\n":
        end -= 1
    return text[start:end]


def _reject_constant(name: str) -> Any:
    raise Malformed(f"tool call JSON contains {name}")


# JSON as models write it; NaN and Infinity are not JSON and would not round-trip.
JSON = json.JSONDecoder(parse_constant=_reject_constant)


def json_object(text: str, pos: int, what: str) -> tuple[dict[str, Any], int]:
    """The JSON object at `pos` (after whitespace) and the index after it."""
    pos = skip_space(text, pos)
    try:
        value, end = JSON.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        raise Malformed(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise Malformed(f"{what} is not a JSON object")
    return value, end


def dumps(value: Any, compact: bool = False) -> str:
    """A chat template's `tojson`: default separators, non-ASCII kept (or none, compact)."""
    if compact:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(value, ensure_ascii=False)


def function_of(call: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """A call's name and arguments (a JSON-text argument string read as its object)."""
    fn = call.get("function", call)
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise OutputFormatError(f"tool call without a name: {call!r}")
    name, arguments = fn["name"], fn.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise OutputFormatError(f"arguments of {name!r} are not JSON: {exc}") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise OutputFormatError(f"arguments of {name!r} are not an object")
    return name, dict(arguments)


def text_of(content: Any) -> str:
    """A message's content as text, read the way templates read it."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            else:
                raise OutputFormatError("only text content parts can be formatted")
        return "".join(texts)
    raise OutputFormatError(f"content must be text, got {type(content).__name__}")


def check_tag_text(value: str, forbidden: str, what: str) -> None:
    if not value or any(ch in value for ch in forbidden):
        raise OutputFormatError(f"{value!r} cannot be written as {what}")


# --- parameter values typed by the request's tool schemas ---------------------------------------


def parameter_schemas(tools: ToolSchemas, name: str) -> Mapping[str, Any]:
    """The `properties` of tool `name`'s parameters, or {} when unknown."""
    for tool in tools or ():
        spec = tool.get("function", tool)
        if isinstance(spec, Mapping) and spec.get("name") == name:
            params = spec.get("parameters")
            props = params.get("properties") if isinstance(params, Mapping) else None
            return props if isinstance(props, Mapping) else {}
    return {}


def schema_types(schema: Any) -> set[str] | None:
    """JSON-schema type names a parameter allows, or None when the schema does not say."""
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    types: set[str] = set()
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or ():
            types |= schema_types(option) or set()
    return types or None


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "string"


_PYTHON_LITERALS = {"True": True, "False": False, "None": None}


def typed_value(raw: str, types: set[str] | None) -> Any:
    """An untyped parameter value (XML-style calls write strings bare, the rest as JSON).

    Without a schema, text that reads as a JSON number, boolean, null, array or object is taken
    as that; with one, only as a type the schema allows (a string parameter never turns into a
    number). Python's `True`/`None` (templates that print values with `|string`) count as JSON's.
    """
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except (json.JSONDecodeError, Malformed):
        if types is None or "string" in types or raw not in _PYTHON_LITERALS:
            return raw
        value = _PYTHON_LITERALS[raw]
    kind = json_type(value)
    if kind == "string":
        return raw
    if types is None or kind in types or (kind == "integer" and "number" in types):
        return value
    return raw


def value_text(value: Any, compact: bool = False) -> str:
    """How XML-style calls write a parameter value: strings bare, the rest as JSON."""
    return value if isinstance(value, str) else dumps(value, compact)
