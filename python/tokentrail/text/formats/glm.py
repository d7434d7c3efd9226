"""GLM-4.5/4.6 and GLM-4.7 tool calls: `<tool_call>NAME` then `<arg_key>`/`<arg_value>` pairs.

GLM-4.5 puts a newline after the name and after every tag pair, and one before each call;
GLM-4.7 writes the same tags with no whitespace at all. Values are untyped text (strings bare,
the rest as JSON): the request's tool schemas decide what a value is.
"""

from __future__ import annotations

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
    function_of,
    make_call,
    parameter_schemas,
    register_tool_format,
    schema_types,
    skip_space,
    typed_value,
    value_text,
)

KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"


class GlmCalls(TaggedCalls):
    """GLM's `<tool_call>` blocks, split as every tagged format splits them; GLM reads and
    writes one block its own way, and gives each call whole once its `</tool_call>` is sampled."""

    call_end = TOOL_CALL_CLOSE
    content_newlines = 1
    # Whitespace the layout puts after the name and after each key/value tag.
    newline = ""

    def read_call(self, text: str, pos: int, tools: ToolSchemas) -> tuple[ToolCall, int]:
        # The name runs to the first newline, argument or end of the call.
        ends = [i for i in (text.find(t, pos) for t in ("\n", KEY_OPEN, TOOL_CALL_CLOSE)) if i >= 0]
        if not ends:
            raise Malformed("unclosed <tool_call>")
        name = text[pos : min(ends)].strip()
        if not name:
            raise Malformed("tool call has no name")
        schemas = parameter_schemas(tools, name)
        arguments: dict[str, Any] = {}
        pos = min(ends)
        while True:
            pos = skip_space(text, pos)
            if text.startswith(TOOL_CALL_CLOSE, pos):
                return make_call(name, arguments), pos + len(TOOL_CALL_CLOSE)
            if not text.startswith(KEY_OPEN, pos):
                if pos >= len(text):
                    raise Malformed("unclosed <tool_call>")
                raise Malformed(f"unexpected text in tool call {name!r}")
            key_end = text.find(KEY_CLOSE, pos)
            if key_end < 0:
                raise Malformed("unclosed <arg_key>")
            key = text[pos + len(KEY_OPEN) : key_end].strip()
            pos = skip_space(text, key_end + len(KEY_CLOSE))
            if not text.startswith(VALUE_OPEN, pos):
                raise Malformed(f"<arg_key>{key}</arg_key> without a value")
            value_end = text.find(VALUE_CLOSE, pos)
            if value_end < 0:
                raise Malformed(f"unclosed <arg_value> of {key!r}")
            if not key or key in arguments:
                raise Malformed(f"bad or repeated argument key {key!r}")
            raw = text[pos + len(VALUE_OPEN) : value_end]
            arguments[key] = typed_value(raw, schema_types(schemas.get(key)))
            pos = value_end + len(VALUE_CLOSE)

    def write_call(self, call: Mapping[str, Any], compact: bool) -> str:
        name, arguments = function_of(call)
        check_tag_text(name, "<\n", "a GLM tool name")
        nl = self.newline
        parts = [f"{TOOL_CALL_OPEN}{name}{nl}"]
        for key, value in arguments.items():
            if not isinstance(key, str) or not key or key != key.strip() or "<" in key:
                raise OutputFormatError(f"{key!r} cannot be written as <arg_key>")
            text = value_text(value, compact)
            parts.append(f"{KEY_OPEN}{key}{KEY_CLOSE}{nl}{VALUE_OPEN}{text}{VALUE_CLOSE}{nl}")
        parts.append(TOOL_CALL_CLOSE)
        return "".join(parts)


@register_tool_format
class Glm45(GlmCalls):
    name = "glm45"
    newline = "\n"

    def write(
        self, content: str, calls: Sequence[Mapping[str, Any]], *, call_index: int, compact: bool
    ) -> str:
        # A newline before each call and none before the content: the reasoning block's own
        # trailing newline separates it from whatever comes first.
        pieces = [content] if content else []
        return "\n".join(pieces + [self.write_call(call, compact) for call in calls])


@register_tool_format
class Glm47(GlmCalls):
    name = "glm47"

    def write(
        self, content: str, calls: Sequence[Mapping[str, Any]], *, call_index: int, compact: bool
    ) -> str:
        return content + "".join(self.write_call(call, compact) for call in calls)
