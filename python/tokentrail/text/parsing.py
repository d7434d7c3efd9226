"""Output parsing: a model's sampled text into an assistant message, and back.

`parse_output` reads Qwen3 reasoning and tool-call markup (Hermes JSON or Qwen3-Coder XML) without
ever raising; `format_output` writes the text a Qwen3 model emits for a message, byte for byte as
templates/qwen3.jinja renders that assistant turn, so that parsing and re-rendering round-trip.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tokentrail.errors import OutputFormatError
from tokentrail.messages import Message, ToolCall

logger = logging.getLogger(__name__)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

# Where a message's reasoning may live; the first found wins (as in chat_template.render).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ToolFormat(StrEnum):
    """How a model writes tool calls."""

    # Qwen2.5/Qwen3: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
    HERMES = "hermes"
    # Qwen3-Coder: `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...`
    QWEN3_CODER = "qwen3_coder"


class ReasoningFormat(StrEnum):
    """How a model writes its reasoning."""

    # A leading `<think>\n...\n</think>\n\n` block; the opening tag may sit in the prompt instead.
    QWEN3 = "qwen3"


# The newlines a template puts between non-empty content and the first tool call: one in Qwen3's
# Hermes layout (templates/qwen3.jinja), two in Qwen3-Coder's own template.
_CONTENT_TO_CALL = {ToolFormat.HERMES: "\n", ToolFormat.QWEN3_CODER: "\n\n"}


@dataclass(frozen=True)
class ParsedOutput:
    """An assistant message parsed from model output.

    When `ill_formed`, `message` holds the whole text as content and no tool calls, and `reason`
    says what was wrong.
    """

    message: Message
    ill_formed: bool = False
    reason: str | None = None


class _Malformed(Exception):
    pass


def parse_output(
    text: str,
    tool_parser: ToolFormat | str | None = ToolFormat.HERMES,
    reasoning_parser: ReasoningFormat | str | None = ReasoningFormat.QWEN3,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> ParsedOutput:
    """Parse model output text into `{"role": "assistant", "content", ["reasoning_content"],
    ["tool_calls"]}`.

    Never raises on bad markup (unclosed tags, bad JSON, a call without a name, arguments that are
    not an object, text after the tool calls): the result is then ill-formed. `tools` (the request's
    tool schemas) only matters for Qwen3-Coder calls, whose parameter values are untyped text: a
    parameter declared as a string stays a string even when it reads as JSON.
    """
    tool_format = _tool_format(tool_parser)
    if reasoning_parser is not None:
        _reasoning_format(reasoning_parser)
    try:
        reasoning, rest = (None, text) if reasoning_parser is None else _split_reasoning(text)
        message: Message = {"role": "assistant", "content": rest}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if tool_format is not None and TOOL_CALL_OPEN in rest:
            content, calls = _split_tool_calls(rest, tool_format, tools)
            message["content"] = content
            message["tool_calls"] = calls
    except _Malformed as exc:
        logger.debug("ill-formed model output: %s", exc)
        return ParsedOutput({"role": "assistant", "content": text}, True, str(exc))
    return ParsedOutput(message)


def format_output(
    message: Mapping[str, Any], tool_format: ToolFormat | str = ToolFormat.HERMES
) -> str:
    """The text a Qwen3 model emits for `message`: reasoning, content, tool calls.

    The stop token (`<|im_end|>`) is not part of it. For Hermes calls the result is exactly what
    templates/qwen3.jinja renders between `<|im_start|>assistant\\n` and `<|im_end|>`, and
    `parse_output` gives `message` back. The other way round, parsing then formatting returns
    the sampled text only when the model wrote the canonical layout; it differs when the model
    spaced its JSON differently (`{"a":1}`, `1e3`), put other newlines around `</think>` or
    before a call, or left whitespace after its last call. Those tokens are what the engine
    sampled; a re-render of the message does not reproduce them.
    """
    fmt = _tool_format(tool_format)
    if fmt is None:
        raise OutputFormatError("format_output needs a tool format")
    parts = []
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is not None:
        parts.append(f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n")
    content = _text_of(message.get("content"))
    parts.append(content)
    for i, call in enumerate(message.get("tool_calls") or ()):
        if i:
            parts.append("\n")
        elif content:
            parts.append(_CONTENT_TO_CALL[fmt])
        if fmt is ToolFormat.HERMES:
            parts.append(_format_hermes_call(call))
        else:
            parts.append(_format_coder_call(call))
    return "".join(parts)


# --- reasoning ----------------------------------------------------------------------------------


def _split_reasoning(text: str) -> tuple[str | None, str]:
    if text.lstrip().startswith(THINK_OPEN):
        start = text.index(THINK_OPEN) + len(THINK_OPEN)
        end = text.find(THINK_CLOSE, start)
        if end < 0:
            raise _Malformed("unclosed <think>")
        inner = text[start:end]
    else:
        end = text.find(THINK_CLOSE)
        # A `</think>` with no `<think>` before it: the template opened the block in the prompt.
        # Reasoning comes before any tool call, so a `</think>` after one is argument data.
        if end < 0 or THINK_OPEN in text[:end] or TOOL_CALL_OPEN in text[:end]:
            return None, text
        inner = text[:end]
    rest = text[end + len(THINK_CLOSE) :]
    return _strip_one_newline(inner), _lstrip_newlines(rest, 2)


def _strip_one_newline(text: str) -> str:
    text = text.removeprefix("\n")
    return text.removesuffix("\n")


def _lstrip_newlines(text: str, most: int) -> str:
    n = 0
    while n < most and text.startswith("\n", n):
        n += 1
    return text[n:]


def _rstrip_newlines(text: str, most: int) -> str:
    n = 0
    while n < most and text.endswith("\n", 0, len(text) - n):
        n += 1
    return text[: len(text) - n]


# --- tool calls ---------------------------------------------------------------------------------


def _split_tool_calls(
    text: str, fmt: ToolFormat, tools: Sequence[Mapping[str, Any]] | None
) -> tuple[str, list[ToolCall]]:
    first = text.index(TOOL_CALL_OPEN)
    # The separator the template puts before the first call is markup, not content.
    content = _rstrip_newlines(text[:first], len(_CONTENT_TO_CALL[fmt]))
    calls: list[ToolCall] = []
    pos = first
    while True:
        # Each call is read by its own grammar up to its closing tag, not cut at the first
        # `</tool_call>`: an argument may well contain tool-call markup (code about tool calls).
        if fmt is ToolFormat.HERMES:
            call, pos = _parse_hermes_call(text, pos + len(TOOL_CALL_OPEN))
        else:
            call, pos = _parse_coder_call(text, pos + len(TOOL_CALL_OPEN), tools)
        calls.append(call)
        following = text.find(TOOL_CALL_OPEN, pos)
        between = text[pos:] if following < 0 else text[pos:following]
        if between.strip():
            # A message has no place for text after its calls; re-rendering would move it.
            raise _Malformed("text after a tool call")
        if following < 0:
            return content, calls
        pos = following


def _call(name: str, arguments: dict[str, Any]) -> ToolCall:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _expect_close(text: str, pos: int, what: str) -> int:
    """Index after the `</tool_call>` that must follow `pos` (whitespace allowed)."""
    pos = _skip_space(text, pos)
    if text.startswith(TOOL_CALL_CLOSE, pos):
        return pos + len(TOOL_CALL_CLOSE)
    if TOOL_CALL_CLOSE not in text[pos:]:
        raise _Malformed("unclosed <tool_call>")
    raise _Malformed(f"unexpected text after {what}")


def _reject_constant(name: str) -> Any:
    raise _Malformed(f"tool call JSON contains {name}")


_JSON = json.JSONDecoder(parse_constant=_reject_constant)


def _parse_hermes_call(text: str, pos: int) -> tuple[ToolCall, int]:
    pos = _skip_space(text, pos)
    try:
        obj, pos = _JSON.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        if TOOL_CALL_CLOSE not in text[pos:]:
            raise _Malformed("unclosed <tool_call>") from None
        raise _Malformed(f"tool call is not valid JSON: {exc}") from None
    end = _expect_close(text, pos, "the tool call JSON")
    if not isinstance(obj, dict):
        raise _Malformed("tool call is not a JSON object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise _Malformed("tool call has no name")
    # A call to a tool without parameters sometimes leaves `arguments` out.
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, dict):
        raise _Malformed("tool call arguments are not a JSON object")
    return _call(name, arguments), end


_FUNCTION_OPEN = re.compile(r"\s*<function=([^>\n]*)>")
_FUNCTION_CLOSE = "</function>"
_PARAMETER_OPEN = "<parameter="
_PARAMETER_CLOSE = "</parameter>"


def _parse_coder_call(
    text: str, pos: int, tools: Sequence[Mapping[str, Any]] | None
) -> tuple[ToolCall, int]:
    match = _FUNCTION_OPEN.match(text, pos)
    if match is None:
        if TOOL_CALL_CLOSE not in text[pos:]:
            raise _Malformed("unclosed <tool_call>")
        raise _Malformed("tool call is not <function=NAME>...</function>")
    name = match.group(1)
    if not name.strip():
        raise _Malformed("tool call has no name")
    schemas = _parameter_schemas(tools, name)
    arguments: dict[str, Any] = {}
    pos = match.end()
    while True:
        pos = _skip_space(text, pos)
        if text.startswith(_FUNCTION_CLOSE, pos):
            return _call(name, arguments), _expect_close(
                text, pos + len(_FUNCTION_CLOSE), "</function>"
            )
        if not text.startswith(_PARAMETER_OPEN, pos):
            if pos == len(text):
                raise _Malformed("unclosed <tool_call>")
            if text.startswith(TOOL_CALL_CLOSE, pos):
                raise _Malformed(f"missing </function> in <function={name}>")
            raise _Malformed(f"unexpected text in <function={name}>")
        name_end = text.find(">", pos)
        key = text[pos + len(_PARAMETER_OPEN) : name_end] if name_end >= 0 else ""
        if name_end < 0 or not key or "\n" in key:
            raise _Malformed("bad <parameter=NAME> tag")
        close = text.find(_PARAMETER_CLOSE, name_end)
        if close < 0:
            raise _Malformed(f"unclosed <parameter={key}>")
        if key in arguments:
            raise _Malformed(f"parameter {key!r} given twice")
        raw = _strip_one_newline(text[name_end + 1 : close])
        arguments[key] = _coder_value(raw, _schema_types(schemas.get(key)))
        pos = close + len(_PARAMETER_CLOSE)


def _parameter_schemas(tools: Sequence[Mapping[str, Any]] | None, name: str) -> Mapping[str, Any]:
    for tool in tools or ():
        spec = tool.get("function", tool)
        if isinstance(spec, Mapping) and spec.get("name") == name:
            params = spec.get("parameters")
            props = params.get("properties") if isinstance(params, Mapping) else None
            return props if isinstance(props, Mapping) else {}
    return {}


def _schema_types(schema: Any) -> set[str] | None:
    """JSON-schema type names a parameter allows, or None when the schema does not say."""
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    types: set[str] = set()
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or ():
            types |= _schema_types(option) or set()
    return types or None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "string"


_PYTHON_LITERALS = {"True": True, "False": False, "None": None}


def _coder_value(raw: str, types: set[str] | None) -> Any:
    # Qwen3-Coder writes strings bare and everything else as JSON. Without a schema, text that reads
    # as a JSON number, boolean, null, array or object is taken as that; with one, only as a type
    # the schema allows (so a string parameter never turns into a number).
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except (json.JSONDecodeError, _Malformed):
        if types is None or "string" in types or raw not in _PYTHON_LITERALS:
            return raw
        value = _PYTHON_LITERALS[raw]  # Qwen3-Coder's own template prints Python's True/None
    kind = _json_type(value)
    if kind == "string":
        return raw
    if types is None or kind in types or (kind == "integer" and "number" in types):
        return value
    return raw


# --- formatting ---------------------------------------------------------------------------------


def _text_of(content: Any) -> str:
    # Same reading of content as the template's `text_of` macro.
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            else:
                raise OutputFormatError("only text content parts can be formatted")
        return "".join(texts)
    raise OutputFormatError(f"content must be text, got {type(content).__name__}")


def _function_of(call: Mapping[str, Any]) -> tuple[str, Any]:
    fn = call.get("function", call)
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise OutputFormatError(f"tool call without a name: {call!r}")
    return fn["name"], fn.get("arguments")


def _dumps(value: Any) -> str:
    # The chat template's `tojson`: default separators, non-ASCII kept.
    return json.dumps(value, ensure_ascii=False)


def _format_hermes_call(call: Mapping[str, Any]) -> str:
    name, arguments = _function_of(call)
    if isinstance(arguments, str):
        args_text = arguments  # already JSON text (OpenAI style); the template prints it as is
    elif arguments is None:
        args_text = "{}"
    else:
        args_text = _dumps(arguments)
    return (
        f'{TOOL_CALL_OPEN}\n{{"name": {_dumps(name)}, "arguments": {args_text}}}\n{TOOL_CALL_CLOSE}'
    )


def _format_coder_call(call: Mapping[str, Any]) -> str:
    name, arguments = _function_of(call)
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise OutputFormatError(f"arguments of {name!r} are not JSON: {exc}") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise OutputFormatError(f"arguments of {name!r} are not an object")
    if not name or ">" in name or "\n" in name:
        raise OutputFormatError(f"{name!r} cannot be written as <function=NAME>")
    lines = [f"{TOOL_CALL_OPEN}\n<function={name}>\n"]
    for key, value in arguments.items():
        if not isinstance(key, str) or not key or ">" in key or "\n" in key:
            raise OutputFormatError(f"{key!r} cannot be written as <parameter=NAME>")
        text = value if isinstance(value, str) else _dumps(value)
        lines.append(f"{_PARAMETER_OPEN}{key}>\n{text}\n{_PARAMETER_CLOSE}\n")
    lines.append(f"</function>\n{TOOL_CALL_CLOSE}")
    return "".join(lines)


def _tool_format(value: ToolFormat | str | None) -> ToolFormat | None:
    if value is None:
        return None
    try:
        return ToolFormat(value)
    except ValueError:
        known = ", ".join(f.value for f in ToolFormat)
        raise OutputFormatError(f"unknown tool format {value!r}; known: {known}") from None


def _reasoning_format(value: ReasoningFormat | str) -> ReasoningFormat:
    try:
        return ReasoningFormat(value)
    except ValueError:
        known = ", ".join(f.value for f in ReasoningFormat)
        raise OutputFormatError(f"unknown reasoning format {value!r}; known: {known}") from None
