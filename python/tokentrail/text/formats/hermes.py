"""Hermes-style JSON tool calls, as Qwen2.5 and Qwen3 write them.

`<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>`, one block per call, a newline
between blocks and between content and the first block (templates/qwen3.jinja).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokentrail.errors import OutputFormatError
from tokentrail.messages import ToolCall
from tokentrail.text.formats.base import (
    JSON,
    Malformed,
    ToolFormat,
    ToolSchemas,
    dumps,
    function_of,
    make_call,
    register_tool_format,
    skip_space,
    strip_newlines,
)

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

    def read_call(self, text: str, pos: int, tools: ToolSchemas) -> tuple[ToolCall, int]:
        raise NotImplementedError

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

    def write_call(self, call: Mapping[str, Any], compact: bool) -> str:
        raise NotImplementedError


@register_tool_format
class Hermes(TaggedCalls):
    name = "hermes"

    def read_call(self, text: str, pos: int, tools: ToolSchemas) -> tuple[ToolCall, int]:
        pos = skip_space(text, pos)
        try:
            obj, pos = JSON.raw_decode(text, pos)
        except ValueError as exc:
            if TOOL_CALL_CLOSE not in text[pos:]:
                raise Malformed("unclosed <tool_call>") from None
            raise Malformed(f"tool call is not valid JSON: {exc}") from None
        end = expect_close(text, pos, "the tool call JSON")
        if not isinstance(obj, dict):
            raise Malformed("tool call is not a JSON object")
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            raise Malformed("tool call has no name")
        # A call to a tool without parameters sometimes leaves `arguments` out.
        arguments = obj.get("arguments", {})
        if not isinstance(arguments, dict):
            raise Malformed("tool call arguments are not a JSON object")
        return make_call(name, arguments), end

    def write_call(self, call: Mapping[str, Any], compact: bool) -> str:
        fn = call.get("function", call)
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise OutputFormatError(f"tool call without a name: {call!r}")
        raw = fn.get("arguments")
        # JSON text (OpenAI style) is printed as it is, as the template prints it.
        args = raw if isinstance(raw, str) and not compact else dumps(function_of(call)[1], compact)
        item, key = (",", ":") if compact else (", ", ": ")
        head = f'{{"name"{key}{dumps(fn["name"])}{item}"arguments"{key}'
        return f"{TOOL_CALL_OPEN}\n{head}{args}}}\n{TOOL_CALL_CLOSE}"
