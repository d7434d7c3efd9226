"""Output parsing: a model's sampled text into an assistant message, and back.

`parse_output` reads reasoning and tool-call markup in any registered format (`hermes`,
`qwen3_coder`, `deepseek_v31`, `glm45`, `kimi_k2`, `minimax_m2`, `harmony`, `llama3_json`, ...;
see `text.formats`) without ever raising; `format_output` writes the text a model emits for a
message, byte for byte as its family's template renders that assistant turn, so that parsing
and re-rendering round-trip.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokentrail.errors import OutputFormatError
from tokentrail.messages import Message
from tokentrail.text import formats
from tokentrail.text.formats import Malformed, MessageFormat, ReasoningFormat, ToolFormat

logger = logging.getLogger(__name__)

__all__ = ["OutputFormatError", "ParsedOutput", "format_output", "parse_output"]


@dataclass(frozen=True)
class ParsedOutput:
    """An assistant message parsed from model output.

    When `ill_formed`, `message` holds the whole text as content and no tool calls, and `reason`
    says what was wrong.
    """

    message: Message
    ill_formed: bool = False
    reason: str | None = None


def parse_output(
    text: str,
    tool_parser: str | None = "hermes",
    reasoning_parser: str | None = "qwen3",
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> ParsedOutput:
    """Parse model output text into `{"role": "assistant", "content", ["reasoning_content"],
    ["tool_calls"]}`.

    Never raises on bad markup (unclosed tags, bad JSON, a call without a name, arguments that are
    not an object, text after the tool calls): the result is then ill-formed. `tools` (the request's
    tool schemas) matters for formats whose parameter values are untyped text (Qwen3-Coder, GLM,
    MiniMax): a parameter declared as a string stays a string even when it reads as JSON. An
    unknown parser name raises `OutputFormatError`.
    """
    tool_fmt = None if tool_parser is None else formats.tool_format(str(tool_parser))
    reasoning_fmt = (
        None if reasoning_parser is None else formats.reasoning_format(str(reasoning_parser))
    )
    try:
        if isinstance(tool_fmt, MessageFormat):
            message = tool_fmt.parse_message(text, reasoning_fmt is not None, tools)
        else:
            message = _parse(text, tool_fmt, reasoning_fmt, tools)
    except Malformed as exc:
        logger.debug("ill-formed model output: %s", exc)
        return ParsedOutput({"role": "assistant", "content": text}, True, str(exc))
    return ParsedOutput(message)


def _parse(
    text: str,
    tool_fmt: ToolFormat | None,
    reasoning_fmt: ReasoningFormat | None,
    tools: Sequence[Mapping[str, Any]] | None,
) -> Message:
    call_start = tool_fmt.call_start if tool_fmt is not None else None
    reasoning, rest = (
        (None, text) if reasoning_fmt is None else reasoning_fmt.split(text, call_start)
    )
    message: Message = {"role": "assistant", "content": rest}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if tool_fmt is not None and tool_fmt.has_calls(rest):
        content, calls = tool_fmt.split(rest, tools)
        message["content"] = content
        if calls:
            message["tool_calls"] = calls
    return message


def format_output(
    message: Mapping[str, Any],
    tool_format: str = "hermes",
    reasoning_format: str | None = "qwen3",
    *,
    opened: bool = False,
    call_index: int = 0,
    compact: bool = False,
) -> str:
    """The text a model emits for `message`: reasoning, content, tool calls.

    The stop token is not part of it. `opened`: the prompt already opened the reasoning block
    (its generation prompt ends with `<think>`); `call_index`: how many calls the conversation
    held before this message (Kimi numbers calls); `compact`: JSON without spaces, as models
    sometimes write it. For Hermes calls the result is exactly what templates/qwen3.jinja
    renders between `<|im_start|>assistant\\n` and `<|im_end|>`, and `parse_output` gives
    `message` back. The other way round, parsing then formatting returns the sampled text only
    when the model wrote the canonical layout; it differs when the model spaced its JSON
    differently (`{"a":1}`, `1e3`), put other newlines around `</think>` or before a call, or
    left whitespace after its last call. Those tokens are what the engine sampled; a re-render
    of the message does not reproduce them.
    """
    if tool_format is None:
        raise OutputFormatError("format_output needs a tool format")
    tool_fmt = formats.tool_format(str(tool_format))
    reasoning_fmt = None if reasoning_format is None else formats.reasoning_format(reasoning_format)
    return tool_fmt.write_message(
        message, reasoning_fmt, opened=opened, call_index=call_index, compact=compact
    )
