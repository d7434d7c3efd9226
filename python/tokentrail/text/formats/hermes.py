"""Hermes-style JSON tool calls, as Qwen2.5 and Qwen3 write them.

`<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>`, one block per call, a newline
between blocks and between content and the first block (templates/qwen3.jinja).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokentrail.errors import OutputFormatError
from tokentrail.messages import ToolCall
from tokentrail.text.formats.base import (
    JSON,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    Malformed,
    TaggedCalls,
    ToolSchemas,
    dumps,
    expect_close,
    function_of,
    make_call,
    register_tool_format,
    skip_space,
)


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
