"""MiniMax-M2's tool calls: one `<minimax:tool_call>` block of `<invoke name=...>` elements.

`\\n<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="K">V</parameter>\\n</invoke>\\n
</minimax:tool_call>` after the content. Values are untyped text (strings bare, the rest as
JSON): the request's tool schemas decide what a value is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tokentrail.errors import OutputFormatError
from tokentrail.messages import ToolCall
from tokentrail.text.formats.base import (
    Malformed,
    ToolFormat,
    ToolSchemas,
    check_tag_text,
    function_of,
    make_call,
    parameter_schemas,
    register_tool_format,
    schema_types,
    skip_space,
    strip_newlines,
    typed_value,
    value_text,
)

BLOCK_OPEN, BLOCK_CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
_INVOKE = re.compile(r'<invoke name="([^"\n]+)">')
_INVOKE_END = "</invoke>"
_PARAMETER = re.compile(r'<parameter name="([^"\n]+)">')
_PARAMETER_END = "</parameter>"


@register_tool_format
class MinimaxM2(ToolFormat):
    name = "minimax_m2"
    call_start = BLOCK_OPEN

    def split(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall]]:
        first = text.index(BLOCK_OPEN)
        pos = first + len(BLOCK_OPEN)
        calls: list[ToolCall] = []
        while True:
            pos = skip_space(text, pos)
            if text.startswith(BLOCK_CLOSE, pos):
                break
            match = _INVOKE.match(text, pos)
            if match is None:
                if pos >= len(text):
                    raise Malformed("unclosed <minimax:tool_call>")
                raise Malformed("unexpected text in <minimax:tool_call>")
            name = match.group(1)
            arguments, pos = self._parameters(text, match.end(), name, tools)
            calls.append(make_call(name, arguments))
        if text[pos + len(BLOCK_CLOSE) :].strip():
            raise Malformed("text after the tool calls")
        if not calls:
            raise Malformed("an empty <minimax:tool_call> block")
        return strip_newlines(text[:first], 0, 1), calls

    def _parameters(
        self, text: str, pos: int, name: str, tools: ToolSchemas
    ) -> tuple[dict[str, Any], int]:
        schemas = parameter_schemas(tools, name)
        arguments: dict[str, Any] = {}
        while True:
            pos = skip_space(text, pos)
            if text.startswith(_INVOKE_END, pos):
                return arguments, pos + len(_INVOKE_END)
            match = _PARAMETER.match(text, pos)
            if match is None:
                if pos >= len(text):
                    raise Malformed(f"unclosed invoke {name!r}")
                raise Malformed(f"unexpected text in invoke {name!r}")
            key = match.group(1)
            close = text.find(_PARAMETER_END, match.end())
            if close < 0:
                raise Malformed(f"unclosed parameter {key!r}")
            if key in arguments:
                raise Malformed(f"parameter {key!r} given twice")
            raw = text[match.end() : close]
            arguments[key] = typed_value(raw, schema_types(schemas.get(key)))
            pos = close + len(_PARAMETER_END)

    def write(
        self, content: str, calls: Sequence[Mapping[str, Any]], *, call_index: int, compact: bool
    ) -> str:
        if not calls:
            return content
        parts = [content, f"\n{BLOCK_OPEN}\n"]
        for call in calls:
            name, arguments = function_of(call)
            check_tag_text(name, '"\n', "an invoke name")
            parts.append(f'<invoke name="{name}">\n')
            for key, value in arguments.items():
                if not isinstance(key, str):
                    raise OutputFormatError(f"{key!r} cannot be a parameter name")
                check_tag_text(key, '"\n', "a parameter name")
                text = value_text(value, compact)
                parts.append(f'<parameter name="{key}">{text}{_PARAMETER_END}\n')
            parts.append(f"{_INVOKE_END}\n")
        parts.append(BLOCK_CLOSE)
        return "".join(parts)
