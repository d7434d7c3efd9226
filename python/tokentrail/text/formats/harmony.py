"""gpt-oss's harmony format: a reply is a run of messages on named channels.

After the prompt's `<|start|>assistant`, the model writes messages
`<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]<|message|>TEXT`, joined by
`<|end|><|start|>assistant`, and stops on `<|call|>` (a call) or `<|return|>` (the answer).
`analysis` is the reasoning, `commentary` without a recipient a preamble shown to the user,
`commentary` to `functions.NAME` a call whose text is its JSON arguments, `final` the answer.
The recipient may also stand before the channel (` to=functions.NAME<|channel|>commentary json`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tokentrail.errors import OutputFormatError
from tokentrail.messages import Message, ToolCall
from tokentrail.text.formats.base import (
    Malformed,
    MessageFormat,
    ReasoningFormat,
    ToolSchemas,
    check_tag_text,
    dumps,
    function_of,
    json_object,
    make_call,
    reasoning_of,
    register_reasoning_format,
    register_tool_format,
    text_of,
)

START, END, MESSAGE = "<|start|>", "<|end|>", "<|message|>"
CHANNEL, CONSTRAIN = "<|channel|>", "<|constrain|>"
NEXT = f"{END}{START}assistant"
_CHANNEL = re.compile(re.escape(CHANNEL) + r"(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


def _message(channel: str, text: str, recipient: str | None = None) -> str:
    if recipient is None:
        return f"{CHANNEL}{channel}{MESSAGE}{text}"
    return f"{CHANNEL}{channel} to={recipient} {CONSTRAIN}json{MESSAGE}{text}"


@register_tool_format
class Harmony(MessageFormat):
    name = "harmony"
    call_start = NEXT

    def split(self, text: str, tools: ToolSchemas) -> tuple[str, list[ToolCall]]:
        message = self.parse_message(text, True, tools)
        return message.get("content", ""), message.get("tool_calls", [])

    def parse_message(self, text: str, reasoning: bool, tools: ToolSchemas) -> Message:
        analysis: list[str] = []
        shown: list[str] = []
        calls: list[ToolCall] = []
        for part in text.split(NEXT):
            header, sep, body = part.partition(MESSAGE)
            if not sep:
                raise Malformed("a harmony message without <|message|>")
            channel = _CHANNEL.search(header)
            if channel is None:
                raise Malformed("a harmony message without a channel")
            recipient = _RECIPIENT.search(header)
            if calls:
                raise Malformed("a message after a tool call")
            if recipient is not None:
                arguments, end = json_object(body, 0, "tool call arguments")
                if body[end:].strip():
                    raise Malformed("text after the tool call arguments")
                name = recipient.group(1).removeprefix("functions.")
                calls.append(make_call(name, arguments))
            elif channel.group(1) == "analysis":
                analysis.append(body)
            elif channel.group(1) in ("commentary", "final"):
                shown.append(body)
            else:
                raise Malformed(f"unknown channel {channel.group(1)!r}")
        if not reasoning:
            shown = analysis + shown
        message: Message = {"role": "assistant", "content": "\n".join(shown)}
        if reasoning and analysis:
            message["reasoning_content"] = "\n".join(analysis)
        if calls:
            message["tool_calls"] = calls
        return message

    def write(
        self, content: str, calls: Sequence[Mapping[str, Any]], *, call_index: int, compact: bool
    ) -> str:
        return self.write_message(
            {"content": content, "tool_calls": list(calls)},
            None,
            opened=True,
            call_index=call_index,
            compact=compact,
        )

    def write_message(
        self,
        message: Mapping[str, Any],
        reasoning: ReasoningFormat | None,
        *,
        opened: bool,
        call_index: int,
        compact: bool,
    ) -> str:
        calls = message.get("tool_calls") or ()
        if len(calls) > 1:
            raise OutputFormatError("a harmony reply ends at its first call: one call at most")
        content = text_of(message.get("content"))
        thought = reasoning_of(message) if reasoning is not None else None
        parts = [] if thought is None else [_message("analysis", thought)]
        if calls:
            if content:
                parts.append(_message("commentary", content))
            name, arguments = function_of(calls[0])
            check_tag_text(name, " <\n", "a harmony recipient")
            parts.append(_message("commentary", dumps(arguments, compact), f"functions.{name}"))
        else:
            parts.append(_message("final", content))
        return NEXT.join(parts)


class _Channels(ReasoningFormat):
    """The analysis channel, which the harmony tool format reads and writes itself."""

    def split(self, text: str, call_start: str | None) -> tuple[str | None, str]:
        return None, text

    def wrap(self, reasoning: str | None, body: str, *, opened: bool) -> str:
        return body


register_reasoning_format(_Channels("harmony"))
