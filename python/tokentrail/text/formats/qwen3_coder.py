"""XML tool calls with one tag per parameter: Qwen3-Coder, Qwen3.5/3.6 and Nemotron 3.

`<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`.
Values are untyped text (strings bare, the rest as JSON), so the request's tool schemas decide
what a value is. Nemotron 3 writes the same calls with other whitespace and Python's `str()`
for scalars (`True`, `None`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tokentrail.errors import OutputFormatError
from tokentrail.messages import ToolCall
from tokentrail.text.formats.base import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    Malformed,
    TaggedCalls,
    ToolSchemas,
    check_tag_text,
    dumps,
    expect_close,
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

_FUNCTION_OPEN = re.compile(r"\s*<function=([^>\n]*)>")
_FUNCTION_CLOSE = "</function>"
_PARAMETER_OPEN = "<parameter="
_PARAMETER_CLOSE = "</parameter>"


@register_tool_format
class Qwen3Coder(TaggedCalls):
    name = "qwen3_coder"
    # Qwen3-Coder's and Qwen3.6's templates put a blank line between content and the calls.
    content_to_call = "\n\n"

    def read_call(self, text: str, pos: int, tools: ToolSchemas) -> tuple[ToolCall, int]:
        match = _FUNCTION_OPEN.match(text, pos)
        if match is None:
            if TOOL_CALL_CLOSE not in text[pos:]:
                raise Malformed("unclosed <tool_call>")
            raise Malformed("tool call is not <function=NAME>...</function>")
        name = match.group(1)
        if not name.strip():
            raise Malformed("tool call has no name")
        schemas = parameter_schemas(tools, name)
        arguments: dict[str, Any] = {}
        pos = match.end()
        while True:
            pos = skip_space(text, pos)
            if text.startswith(_FUNCTION_CLOSE, pos):
                end = expect_close(text, pos + len(_FUNCTION_CLOSE), "</function>")
                return make_call(name, arguments), end
            if not text.startswith(_PARAMETER_OPEN, pos):
                if pos == len(text):
                    raise Malformed("unclosed <tool_call>")
                if text.startswith(TOOL_CALL_CLOSE, pos):
                    raise Malformed(f"missing </function> in <function={name}>")
                raise Malformed(f"unexpected text in <function={name}>")
            name_end = text.find(">", pos)
            key = text[pos + len(_PARAMETER_OPEN) : name_end] if name_end >= 0 else ""
            if name_end < 0 or not key or "\n" in key:
                raise Malformed("bad <parameter=NAME> tag")
            close = text.find(_PARAMETER_CLOSE, name_end)
            if close < 0:
                raise Malformed(f"unclosed <parameter={key}>")
            if key in arguments:
                raise Malformed(f"parameter {key!r} given twice")
            raw = strip_newlines(text[name_end + 1 : close], 1, 1)
            arguments[key] = typed_value(raw, schema_types(schemas.get(key)))
            pos = close + len(_PARAMETER_CLOSE)

    def value(self, value: Any, compact: bool) -> str:
        return value_text(value, compact)

    def write_call(self, call: Mapping[str, Any], compact: bool) -> str:
        name, arguments = function_of(call)
        check_tag_text(name, ">\n", "<function=NAME>")
        lines = [f"{TOOL_CALL_OPEN}\n<function={name}>\n"]
        for key, value in arguments.items():
            if not isinstance(key, str):
                raise OutputFormatError(f"{key!r} cannot be written as <parameter=NAME>")
            check_tag_text(key, ">\n", "<parameter=NAME>")
            lines.append(
                f"{_PARAMETER_OPEN}{key}>\n{self.value(value, compact)}\n{_PARAMETER_CLOSE}\n"
            )
        lines.append(f"{_FUNCTION_CLOSE}\n{TOOL_CALL_CLOSE}")
        return "".join(lines)


def _python_str(value: Any) -> str:
    # Jinja's `|string` on a scalar is Python's str(): True, None, 1.5.
    return str(value)


@register_tool_format
class Nemotron3(Qwen3Coder):
    """Nemotron 3: content then a newline, every call followed by a newline; scalars printed by
    Python's `str()`, mappings and lists as JSON."""

    name = "nemotron3"
    content_to_call = "\n"

    def value(self, value: Any, compact: bool) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, dict | list):
            return dumps(value, compact)
        return _python_str(value)

    def write(
        self, content: str, calls: Sequence[Mapping[str, Any]], *, call_index: int, compact: bool
    ) -> str:
        if not calls:
            return content
        return content + "\n" + "".join(self.write_call(call, compact) + "\n" for call in calls)
