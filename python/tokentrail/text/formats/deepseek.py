"""DeepSeek's tool calls: V3.1's special-token calls and V3.2's DSML markup.

V3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>JSON<｜tool▁call▁end｜>...
<｜tool▁calls▁end｜>` right after the content. V3.2: a `\\n\\n<｜DSML｜function_calls>` block of
`<｜DSML｜invoke name="NAME">` elements whose parameters say whether they are strings
(`string="true"`, written bare) or JSON (`string="false"`). The bars are U+FF5C, the spaces
U+2581, as in the tokens themselves.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from tokentrail.errors import OutputFormatError
from tokentrail.messages import ToolCall
from tokentrail.text.formats.base import (
    JSON,
    Malformed,
    ToolFormat,
    ToolSchemas,
    check_tag_text,
    dumps,
    function_of,
    json_object,
    make_call,
    read_parameters,
    register_tool_format,
    section_calls,
    skip_space,
    strip_newlines,
)

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"


@register_tool_format
class DeepSeekV31(ToolFormat):
    name = "deepseek_v31"
    call_start = CALLS_BEGIN
    call_end = CALL_END
    calls_close = CALLS_END

    def split(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall]]:
        first = text.index(CALLS_BEGIN)
        read = partial(self._call, text)
        calls = section_calls(text, first + len(CALLS_BEGIN), CALLS_END, read, "tool-call section")
        return text[:first], calls

    def _call(self, text: str, pos: int) -> tuple[ToolCall, int] | None:
        if not text.startswith(CALL_BEGIN, pos):
            return None
        sep = text.find(SEP, pos)
        if sep < 0:
            raise Malformed("tool call without <｜tool▁sep｜>")
        name = text[pos + len(CALL_BEGIN) : sep]
        if not name or "<" in name or "\n" in name:
            raise Malformed("tool call has no valid name")
        arguments, pos = json_object(text, sep + len(SEP), "tool call arguments")
        pos = skip_space(text, pos)
        if not text.startswith(CALL_END, pos):
            raise Malformed("tool call arguments not followed by <｜tool▁call▁end｜>")
        return make_call(name, arguments), pos + len(CALL_END)

    def write(
        self, content: str, calls: Sequence[Mapping[str, Any]], *, call_index: int, compact: bool
    ) -> str:
        if not calls:
            return content
        parts = [content, CALLS_BEGIN]
        for call in calls:
            name, arguments = function_of(call)
            check_tag_text(name, "<\n", "a DeepSeek tool name")
            parts.append(f"{CALL_BEGIN}{name}{SEP}{dumps(arguments, compact)}{CALL_END}")
        parts.append(CALLS_END)
        return "".join(parts)


DSML = "｜DSML｜"
DSML_CALLS = f"<{DSML}function_calls>"
DSML_CALLS_END = f"</{DSML}function_calls>"
_INVOKE = re.compile(f'<{DSML}invoke name="([^"\\n]+)">\\n')
_INVOKE_END = f"</{DSML}invoke>"
_PARAMETER = re.compile(f'<{DSML}parameter name="([^"\\n]+)" string="(true|false)">')
_PARAMETER_END = f"</{DSML}parameter>"


def _value(match: re.Match[str], raw: str) -> Any:
    """A DSML parameter's value: its text when `string="true"`, else JSON."""
    if match.group(2) == "true":
        return raw
    try:
        return JSON.decode(raw)
    except json.JSONDecodeError as exc:
        raise Malformed(f"parameter {match.group(1)!r} is not JSON: {exc}") from None


@register_tool_format
class DeepSeekV32(ToolFormat):
    """V3.2's DSML block, after `\\n\\n` (the blank line belongs to the block, not the content)."""

    name = "deepseek_v32"
    call_start = DSML_CALLS
    call_end = _INVOKE_END
    calls_close = DSML_CALLS_END
    content_newlines = 2

    def split(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall]]:
        first = text.index(DSML_CALLS)
        content = strip_newlines(text[:first], 0, 2)
        start = first + len(DSML_CALLS)
        read = partial(self._call, text)
        return content, section_calls(
            text, start, DSML_CALLS_END, read, "DSML function_calls block"
        )

    def _call(self, text: str, pos: int) -> tuple[ToolCall, int] | None:
        match = _INVOKE.match(text, pos)
        if match is None:
            return None
        name = match.group(1)
        arguments, pos = read_parameters(
            text, match.end(), _PARAMETER, _PARAMETER_END, _INVOKE_END, f"invoke {name!r}", _value
        )
        return make_call(name, arguments), pos

    def write(
        self, content: str, calls: Sequence[Mapping[str, Any]], *, call_index: int, compact: bool
    ) -> str:
        if not calls:
            return content
        invokes = []
        for call in calls:
            name, arguments = function_of(call)
            check_tag_text(name, '"\n', "a DSML invoke name")
            params = []
            for key, value in arguments.items():
                if not isinstance(key, str):
                    raise OutputFormatError(f"{key!r} cannot be a DSML parameter name")
                check_tag_text(key, '"\n', "a DSML parameter name")
                if isinstance(value, str):
                    params.append(f'<{DSML}parameter name="{key}" string="true">{value}')
                else:
                    text = dumps(value, compact)
                    params.append(f'<{DSML}parameter name="{key}" string="false">{text}')
                params[-1] += _PARAMETER_END
            invokes.append(
                f'<{DSML}invoke name="{name}">\n' + "\n".join(params) + f"\n{_INVOKE_END}"
            )
        return f"{content}\n\n{DSML_CALLS}\n" + "\n".join(invokes) + f"\n{DSML_CALLS_END}"
