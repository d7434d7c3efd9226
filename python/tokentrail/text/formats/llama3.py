"""Llama 3.1/3.2/3.3 JSON tool calls: the whole reply is `{"name": ..., "parameters": {...}}`.

Meta's format has no markup around a call: a reply that is such an object is a call (with or
without a leading `<|python_tag|>`), anything else is text. vLLM's `llama3_json` also takes
`arguments` for `parameters` and several calls joined by `;`; so does this parser. A reply holds
either text or one call (the template refuses two).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokentrail.errors import OutputFormatError
from tokentrail.messages import ToolCall
from tokentrail.text.formats.base import (
    Malformed,
    ToolFormat,
    ToolSchemas,
    dumps,
    function_of,
    json_object,
    make_call,
    register_tool_format,
    skip_space,
)

PYTHON_TAG = "<|python_tag|>"
_CALL_KEYS = ({"name", "parameters"}, {"name", "arguments"})


def _as_call(obj: dict[str, Any]) -> ToolCall | None:
    keys = set(obj) - {"type"}
    if keys not in _CALL_KEYS or obj.get("type", "function") != "function":
        return None
    name = obj["name"]
    arguments = obj.get("parameters", obj.get("arguments"))
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return make_call(name, arguments)


@register_tool_format
class Llama3Json(ToolFormat):
    name = "llama3_json"
    call_start = PYTHON_TAG

    def has_calls(self, text: str) -> bool:
        head = text.lstrip()
        return head.startswith(PYTHON_TAG) or head.startswith("{")

    def split(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall]]:
        pos = skip_space(text, 0)
        tagged = text.startswith(PYTHON_TAG, pos)
        if tagged:
            pos += len(PYTHON_TAG)
        calls: list[ToolCall] = []
        while True:
            try:
                obj, pos = json_object(text, pos, "tool call")
            except Malformed:
                if tagged:
                    raise
                return text, []  # a reply that starts with "{" but is not JSON: text
            call = _as_call(obj)
            if call is None:
                if tagged:
                    raise Malformed("the <|python_tag|> JSON is not a function call")
                return text, []  # a JSON answer, not a call
            calls.append(call)
            pos = skip_space(text, pos)
            if pos == len(text):
                return "", calls
            if text[pos] != ";":
                raise Malformed("text after a tool call")
            pos += 1

    def write(
        self, content: str, calls: Sequence[Mapping[str, Any]], *, call_index: int, compact: bool
    ) -> str:
        if not calls:
            return content
        if len(calls) > 1 or content:
            raise OutputFormatError("a Llama 3 reply is either text or exactly one tool call")
        name, arguments = function_of(calls[0])
        item, key = (",", ":") if compact else (", ", ": ")
        return f'{{"name"{key}{dumps(name)}{item}"parameters"{key}{dumps(arguments, compact)}}}'
