"""MiniMax-M2's tool calls: one `<minimax:tool_call>` block of `<invoke name=...>` elements.

`\\n<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="K">V</parameter>\\n</invoke>\\n
</minimax:tool_call>` after the content. Values are untyped text (strings bare, the rest as
JSON): the request's tool schemas decide what a value is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from tokentrail.errors import OutputFormatError
from tokentrail.messages import ToolCall
from tokentrail.text.formats.base import (
    ToolFormat,
    ToolSchemas,
    check_tag_text,
    function_of,
    make_call,
    parameter_schemas,
    read_parameters,
    register_tool_format,
    schema_types,
    section_calls,
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
    call_end = _INVOKE_END
    calls_close = BLOCK_CLOSE
    content_newlines = 1

    def split(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall]]:
        first = text.index(BLOCK_OPEN)
        read = partial(self._call, text, tools)
        calls = section_calls(text, first + len(BLOCK_OPEN), BLOCK_CLOSE, read, BLOCK_OPEN)
        return strip_newlines(text[:first], 0, 1), calls

    def _call(self, text: str, tools: ToolSchemas, pos: int) -> tuple[ToolCall, int] | None:
        match = _INVOKE.match(text, pos)
        if match is None:
            return None
        name = match.group(1)
        schemas = parameter_schemas(tools, name)

        def value(parameter: re.Match[str], raw: str) -> Any:
            return typed_value(raw, schema_types(schemas.get(parameter.group(1))))

        arguments, pos = read_parameters(
            text, match.end(), _PARAMETER, _PARAMETER_END, _INVOKE_END, f"invoke {name!r}", value
        )
        return make_call(name, arguments), pos

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
