"""Structured-output constraints that make an engine sample a tool call in the model's own
markup, for a request that forces one (Anthropic `tool_choice` `any`/`tool`, OpenAI
`required` or a named function).

The constraint is a regular expression over the sampled text, which SGLang (`sampling_params`
`regex`) and vLLM (`structured_outputs.regex`) both enforce: the family's reasoning block when
it reasons (laid out as its reasoning format writes it, its text free of the closing tag), then
the call at once, in the tool-call markup of the parser in use, naming one of the allowed tools.
No text may come between the block and the call. The arguments are left free (any text between
the braces), so a call stays the model's own JSON; a call that does not parse is ill-formed, as
without a constraint.

Where the prompt leaves off decides the block: a prompt that opened it (ends with `<think>`)
must see it closed; one that closed it already (a thinking switch turned off) gets none; else
the model may write one, opened as its format opens it.

An engine computes the logprobs of a constrained turn after the grammar's mask, so they are not
the policy's: the turn is tagged `constrained` (see `kinds.ConstrainedPolicy`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from tokentrail.errors import OutputFormatError
from tokentrail.messages import ToolCall
from tokentrail.text import formats
from tokentrail.text.formats.reasoning import THINK_CLOSE, THINK_OPEN, ThinkTags

__all__ = ["OutputConstraint", "forced_tool_call"]

_REGEX_SPECIAL = set(".^$*+?()[]{}|\\")


@dataclass(frozen=True)
class OutputConstraint:
    """A whole-output regular expression, and what it asks for in words (for errors)."""

    regex: str
    wants: str


def _literal(text: str) -> str:
    return "".join(
        "\\n" if ch == "\n" else "\\" + ch if ch in _REGEX_SPECIAL else ch for ch in text
    )


def _class_char(ch: str) -> str:
    return "\\" + ch if ch in "\\]^-[" else ch


def without(word: str) -> str:
    """A regular expression for any text in which `word` does not occur (no lookahead: the
    engines' grammar compilers take none). `word`'s first character must not recur in it,
    which holds for the closing tags this is for (`</think>`)."""
    first, rest = word[0], word[1:]
    if not rest or first in rest:
        raise OutputFormatError(f"cannot build a regex that avoids {word!r}")
    # After `first` and `rest[:k]`: `first` again starts over at one matched character
    # (a loop), any other character but `rest[k]` leaves the word (an exit).
    loops = "|".join(_literal(rest[:k]) + _literal(first) for k in range(len(rest)))
    exits = "|".join(
        _literal(rest[:k]) + f"[^{_class_char(first)}{_class_char(rest[k])}]"
        for k in range(len(rest))
    )
    started = f"{_literal(first)}(?:{loops})*"
    # Text may end partway into the word: `first`, then up to all of `rest` but its last.
    partial = "".join(f"(?:{_literal(ch)}" for ch in rest[:-1]) + ")?" * (len(rest) - 1)
    return f"(?:[^{_class_char(first)}]|{started}(?:{exits}))*(?:{started}{partial})?"


def _json_string(text: str) -> str:
    # The name as the model writes it inside JSON quotes (`json.dumps` minus the quotes).
    return json.dumps(text, ensure_ascii=False)[1:-1]


def forced_tool_call(
    tool_format: str | None,
    names: Sequence[str],
    *,
    reasoning: str | None = None,
    prompt_end: str = "",
) -> OutputConstraint:
    """A constraint for "call one of `names`" in `tool_format`'s markup, right after the
    reasoning block of the `reasoning` format (None: the model does not reason), which the
    prompt's last text `prompt_end` may have opened or closed already. Only the `<tool_call>`
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
    before, after = _around_calls(tool_format, names[0])
    head = _reasoning_block(reasoning, prompt_end)
    wants = f"a call to {names[0]}" if len(names) == 1 else f"a call to one of {', '.join(names)}"
    return OutputConstraint(head + _literal(before) + call + _literal(after), wants)


def _around_calls(tool_format: str, name: str) -> tuple[str, str]:
    """The text the format writes before its first call and after its last, with no content."""
    call: ToolCall = {"type": "function", "function": {"name": name, "arguments": {}}}
    written = formats.tool_format(tool_format).write("", [call], call_index=0, compact=False)
    start, end = written.find("<tool_call>"), written.rfind("</tool_call>")
    return written[:start], written[end + len("</tool_call>") :]


def _reasoning_block(reasoning: str | None, prompt_end: str) -> str:
    """The reasoning block a forced call may (or must) follow, as a regex."""
    if reasoning is None:
        return ""
    fmt = formats.reasoning_format(reasoning)
    if not isinstance(fmt, ThinkTags):
        raise OutputFormatError(
            f"forcing a tool call is not supported after {reasoning!r} reasoning"
        )
    end = prompt_end.rstrip()
    if end.endswith(THINK_CLOSE):
        return ""  # the prompt closed the block (thinking switched off)
    block = without(THINK_CLOSE) + _literal(THINK_CLOSE + "\n" * fmt.after)
    if end.endswith(THINK_OPEN):
        return block  # the prompt opened it: the model closes it
    opening = _literal(fmt.lead + THINK_OPEN + "\n" * fmt.inner[0])
    return f"{opening}{block}" if fmt.always else f"(?:{opening}{block})?"
