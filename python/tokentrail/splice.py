"""Token-exact history: the next prompt is the held tokens, then only the new messages' tokens.

Re-rendering a generated assistant message rarely reproduces the tokens that were sampled (JSON
spacing, booleans, templates that drop earlier reasoning). A splice keeps what was sampled: the
prompt becomes the previous turn's prompt and output ids, the template's glue after an assistant
turn's end, and the tokens of only the new messages. Glue and tail come from the template
itself, rendered after a small synthetic context, and are checked against the full render every
turn; any check that fails falls back to the full render with a named reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from tokentrail.chat_template import TemplateError, render
from tokentrail.manager import TrajectoryManager
from tokentrail.tokenizer import LoadedTokenizer
from tokentrail.tree import MessageKey

logger = logging.getLogger(__name__)


class History(StrEnum):
    """How a turn's prompt ids are built from the conversation."""

    # Held tokens of the last generated turn, glue, then the new messages' tokens.
    SPLICE = "splice"
    # Render and tokenize the whole conversation (the upstream behaviour).
    RENDER = "render"


class Fallback(StrEnum):
    """Why a turn that could have been spliced was rendered in full instead."""

    # The sampled output was cut by the length limit: no end-of-turn token to splice after.
    LENGTH = "length"
    # The output does not end with the token the template closes an assistant turn with.
    NO_END_TOKEN = "no_end_token"
    # The template's rendering of the assistant turn has no end marker to cut the glue at.
    NO_BOUNDARY = "no_boundary"
    # Adding messages changed how the synthetic context renders: the template is not
    # prefix-preserving.
    NOT_PREFIX = "not_prefix"
    # The full render does not end with the derived glue and tail: the new messages render
    # differently in context (a position-dependent template).
    TAIL_MISMATCH = "tail_mismatch"
    # The template refused the synthetic context.
    TEMPLATE_ERROR = "template_error"


@dataclass(frozen=True)
class Spliced:
    """The result of one splice attempt: the prompt ids, or why there are none."""

    prompt_ids: np.ndarray | None
    fallback: Fallback | None = None
    glue: str = ""
    tail: str = ""


def _stub(message: dict[str, Any]) -> dict[str, Any]:
    # Without its reasoning, the last assistant message renders the same whether or not the
    # template strips reasoning before the last user message.
    return {k: v for k, v in message.items() if k not in ("reasoning_content", "reasoning")}


class Splicer:
    """Derives glue and tail from a template and builds spliced prompt ids."""

    def __init__(self, tokenizer: LoadedTokenizer, template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = template or tokenizer.chat_template

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        return render(
            self.template,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            **self.tokenizer.special_tokens_map,
        )

    def glue_and_tail(
        self,
        last_assistant: dict[str, Any],
        end_token: str,
        new_messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> tuple[str, str] | Fallback:
        """The text after an assistant turn's end token: the glue, then the new messages and
        the generation prompt, derived from renders around a synthetic context."""
        stub = _stub(last_assistant)
        # Tools render once, before the conversation, in every template we know of: leaving
        # them out of both renders keeps the difference and spares rendering every schema. The
        # check against the full render (which has them) catches a template where they matter.
        del tools
        try:
            before = self.render([stub], None, add_generation_prompt=False)
            after = self.render([stub, *new_messages], None, add_generation_prompt=True)
        except TemplateError:
            return Fallback.TEMPLATE_ERROR
        cut = before.rfind(end_token)
        if cut < 0:
            return Fallback.NO_BOUNDARY
        if not after.startswith(before):
            return Fallback.NOT_PREFIX
        return before[cut + len(end_token) :], after[len(before) :]

    def splice(
        self,
        *,
        held_prompt: Sequence[int],
        held_output: Sequence[int],
        finish_reason: str | None,
        last_assistant: dict[str, Any],
        new_messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        full_text: str | None,
    ) -> Spliced:
        """Prompt ids for the new messages after a generated turn, or a named fallback.

        `full_text` is the full render of the conversation; the spliced tail must be its suffix.
        None skips that check (the synthetic-context checks still run): see `prompt_ids_for_turn`.
        """
        if finish_reason == "length":
            return Spliced(None, Fallback.LENGTH)
        if not len(held_output):
            return Spliced(None, Fallback.NO_END_TOKEN)
        end_id = int(held_output[-1])
        end_token = self.tokenizer.decode([end_id])
        if self.tokenizer.added_tokens.get(end_token) != end_id:
            return Spliced(None, Fallback.NO_END_TOKEN)
        derived = self.glue_and_tail(last_assistant, end_token, new_messages, tools)
        if isinstance(derived, Fallback):
            return Spliced(None, derived)
        glue, tail = derived
        if full_text is not None and not full_text.endswith(end_token + glue + tail):
            return Spliced(None, Fallback.TAIL_MISMATCH, glue, tail)
        # The held tokens end with a special token, where tokenization always splits, so the
        # glue and tail tokenize the same here as inside the full text.
        new = np.asarray(self.tokenizer.encode(glue + tail), dtype=np.uint32)
        ids = np.concatenate(
            [np.asarray(held_prompt, np.uint32), np.asarray(held_output, np.uint32), new]
        )
        return Spliced(ids, None, glue, tail)


def prompt_ids_for_turn(
    manager: TrajectoryManager,
    splicer: Splicer,
    sid: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    history: History,
    *,
    full_text: Callable[[], str],
    encode: Callable[[str], Any] | None = None,
    keys: list[MessageKey] | None = None,
    verify: bool | Callable[[Sequence[dict[str, Any]]], bool] = True,
) -> tuple[Any, str, Fallback | None]:
    """A turn's prompt ids and how they were built: "splice", "render" or
    "splice_fallback:<reason>".

    `full_text()` renders the whole conversation; it is called only when needed: for a render,
    a fallback, or when `verify` asks to check the spliced tail against the full render.
    `encode` tokenizes a full render (default: the tokenizer's plain encode). `verify` may be
    a function of the new messages.
    """
    encode = encode or splicer.tokenizer.encode
    anchor = manager.splice_anchor(sid, messages, keys) if history is History.SPLICE else None
    if anchor is None:
        return encode(full_text()), History.RENDER.value, None
    new = messages[anchor.index + 1 :]
    text = full_text() if (verify(new) if callable(verify) else verify) else None
    spliced = splicer.splice(
        held_prompt=anchor.prompt_ids,
        held_output=anchor.output_ids,
        finish_reason=anchor.finish_reason,
        last_assistant=anchor.message,
        new_messages=new,
        tools=tools,
        full_text=text,
    )
    if spliced.prompt_ids is None:
        label = f"splice_fallback:{spliced.fallback}"
        return encode(text if text is not None else full_text()), label, spliced.fallback
    return spliced.prompt_ids, History.SPLICE.value, None


# -- checking a template ---------------------------------------------------------------------

_CALL = {"type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}
BOUNDARIES: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
    # name: (conversation up to and including the assistant turn, the messages that follow)
    "user": (
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."}],
        [{"role": "user", "content": "list the files"}],
    ),
    "assistant-with-tool-calls": (
        [
            {"role": "user", "content": "list"},
            {"role": "assistant", "content": "", "tool_calls": [_CALL]},
        ],
        [{"role": "tool", "content": "a.py"}],
    ),
    "tool": (
        [
            {"role": "user", "content": "list"},
            {"role": "assistant", "content": "Listing.", "tool_calls": [_CALL, _CALL]},
        ],
        [{"role": "tool", "content": "a.py"}, {"role": "tool", "content": "b.py"}],
    ),
    "reasoning": (
        [
            {"role": "user", "content": "why?"},
            {"role": "assistant", "content": "Because.", "reasoning_content": "Think first."},
        ],
        [{"role": "user", "content": "and then?"}],
    ),
}


@dataclass(frozen=True)
class BoundaryReport:
    name: str
    prefix_preserving: bool
    splice: bool
    glue: str | None
    fallback: Fallback | None


def check_template(tokenizer: LoadedTokenizer, template: str | None = None) -> list[BoundaryReport]:
    """For each boundary: is the template prefix-preserving there, can a turn be spliced, and
    with what glue after the assistant's end token (the tokenizer's eos token)."""
    splicer = Splicer(tokenizer, template)
    end = tokenizer.eos_token
    system = [{"role": "system", "content": "You are terse."}]
    reports = []
    for name, (history, new) in BOUNDARIES.items():
        history = system + history
        try:
            before = splicer.render(history, None, add_generation_prompt=False)
            full = splicer.render(history + new, None, add_generation_prompt=True)
        except TemplateError:
            reports.append(BoundaryReport(name, False, False, None, Fallback.TEMPLATE_ERROR))
            continue
        derived = splicer.glue_and_tail(history[-1], end, new, None)
        if isinstance(derived, Fallback):
            reports.append(BoundaryReport(name, full.startswith(before), False, None, derived))
            continue
        glue, tail = derived
        ok = full.endswith(end + glue + tail)
        reports.append(
            BoundaryReport(
                name, full.startswith(before), ok, glue, None if ok else Fallback.TAIL_MISMATCH
            )
        )
    return reports
