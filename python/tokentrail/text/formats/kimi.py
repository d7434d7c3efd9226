"""Kimi K2's tool calls: a section of calls, each named by an id `functions.NAME:INDEX`.

`<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>
JSON<|tool_call_end|>...<|tool_calls_section_end|>`, right after the content. IDX counts the
conversation's calls from 0 (Moonshot's guidance); the name is the id without `functions.` and
`:IDX`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from tokentrail.messages import ToolCall
from tokentrail.text.formats.base import (
    Malformed,
    ToolFormat,
    ToolSchemas,
    check_tag_text,
    dumps,
    function_of,
    json_object,
    make_call,
    register_tool_format,
    section_calls,
    skip_space,
)

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
_CALL_ID = re.compile(r"\s*(?:functions\.)?([^\s<]+?):(\d+)\s*")


def call_id(name: str, index: int) -> str:
    """The id Kimi writes for the conversation's `index`-th call (from 0)."""
    return f"functions.{name}:{index}"


@register_tool_format
class KimiK2(ToolFormat):
    name = "kimi_k2"
    call_start = SECTION_BEGIN
    call_end = CALL_END
    calls_close = SECTION_END

    def split(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall]]:
        first = text.index(SECTION_BEGIN)
        read = partial(self._call, text)
        start = first + len(SECTION_BEGIN)
        return text[:first], section_calls(text, start, SECTION_END, read, "tool-call section")

    def _call(self, text: str, pos: int) -> tuple[ToolCall, int] | None:
        if not text.startswith(CALL_BEGIN, pos):
            return None
        arg_at = text.find(ARGUMENT_BEGIN, pos)
        match = _CALL_ID.fullmatch(text, pos + len(CALL_BEGIN), max(arg_at, 0))
        if arg_at < 0 or match is None:
            raise Malformed("tool call without an id functions.NAME:INDEX")
        arguments, pos = json_object(text, arg_at + len(ARGUMENT_BEGIN), "tool call arguments")
        pos = skip_space(text, pos)
        if not text.startswith(CALL_END, pos):
            raise Malformed("tool call arguments not followed by <|tool_call_end|>")
        return make_call(match.group(1), arguments), pos + len(CALL_END)

    def write(
        self, content: str, calls: Sequence[Mapping[str, Any]], *, call_index: int, compact: bool
    ) -> str:
        if not calls:
            return content
        parts = [content, SECTION_BEGIN]
        for offset, call in enumerate(calls):
            name, arguments = function_of(call)
            check_tag_text(name, "<: \n", "a Kimi tool name")
            ident = call_id(name, call_index + offset)
            parts.append(
                f"{CALL_BEGIN}{ident}{ARGUMENT_BEGIN}{dumps(arguments, compact)}{CALL_END}"
            )
        parts.append(SECTION_END)
        return "".join(parts)
