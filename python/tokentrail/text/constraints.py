"""Structured-output constraints that make an engine sample a tool call in the model's own
markup, for a request that forces one (Anthropic `tool_choice` `any`/`tool`, OpenAI
`required` or a named function).

The constraint is a regular expression over the sampled text, which SGLang (`sampling_params`
`regex`) and vLLM (`structured_outputs.regex`) both enforce: an optional reasoning block, then
the tool-call markup of the parser in use, naming one of the allowed tools. The arguments are
left free (any text between the braces), so a call stays the model's own JSON; a call that does
not parse is ill-formed, as without a constraint.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from tokentrail.errors import OutputFormatError
from tokentrail.text.formats.reasoning import THINK_CLOSE

__all__ = ["OutputConstraint", "forced_tool_call"]

_REGEX_SPECIAL = set(".^$*+?()[]{}|\\")


@dataclass(frozen=True)
class OutputConstraint:
    """A whole-output regular expression, and what it asks for in words (for errors)."""

    regex: str
    wants: str


def _literal(text: str) -> str:
    return "".join("\\" + ch if ch in _REGEX_SPECIAL else ch for ch in text)


def _json_string(text: str) -> str:
    # The name as the model writes it inside JSON quotes (`json.dumps` minus the quotes).
    return json.dumps(text, ensure_ascii=False)[1:-1]


def forced_tool_call(
    tool_format: str | None, names: Sequence[str], *, reasoning: bool
) -> OutputConstraint:
    """A constraint for "call one of `names`" in `tool_format`'s markup, after an optional
    reasoning block (`...</think>` and blank lines) when `reasoning`. Only the `<tool_call>`
    formats (`hermes`, `qwen3_coder`, `nemotron3`) have one; for the others this raises
    `OutputFormatError`, which the adapter answers as the engine's limit."""
    if tool_format is None:
        raise OutputFormatError("a forced tool call needs a tool parser")
    if not names:
        raise OutputFormatError("a forced tool call needs at least one tool")
    if tool_format == "hermes":
        choice = "|".join(_literal(_json_string(n)) for n in names)
        head_json = rf'\{{"name": "(?:{choice})", "arguments": '
        call = rf"<tool_call>\n{head_json}\{{[\s\S]*\}}\}}\n</tool_call>"
    elif tool_format in ("qwen3_coder", "nemotron3"):
        choice = "|".join(_literal(n) for n in names)
        call = rf"<tool_call>\n<function=(?:{choice})>\n[\s\S]*</function>\n</tool_call>"
    else:
        raise OutputFormatError(
            f"forcing a tool call is not supported for the {tool_format!r} output format"
        )
    head = rf"(?:[\s\S]*{_literal(THINK_CLOSE)}\n\n)?" if reasoning else ""
    wants = f"a call to {names[0]}" if len(names) == 1 else f"a call to one of {', '.join(names)}"
    return OutputConstraint(head + call, wants)
