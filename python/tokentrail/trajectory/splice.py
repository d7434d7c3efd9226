"""Token-exact history: the next prompt is the held tokens, then only the new messages' tokens.

Re-rendering a generated assistant message rarely reproduces the tokens that were sampled (JSON
spacing, booleans, templates that drop earlier reasoning). A splice keeps what was sampled: the
prompt becomes the previous turn's prompt and output ids, the template's glue after an assistant
turn's end, and the tokens of only the new messages. Glue and tail come from the template
itself, rendered after a small synthetic context (a user query, then the assistant turn without
its reasoning), and are checked against the full render; any check that fails falls back to the
full render with a named reason. The end token may be one the template writes after the turn
(`<|im_end|>`), the next message's own start (GLM's `<|observation|>`), or one the template
writes differently in history (gpt-oss samples `<|return|>`, history has `<|end|>`).

A turn cut by its `max_tokens` (finish reason `length`) sampled no end token: its ids are kept
as sampled and the template's end of that turn (the end token the family's model samples after
such a message, as the template writes it in history) follows them, so the next prompt still
continues the sampled ids exactly. That end must be one added token, where tokenization always
splits; otherwise the turn falls back (`Fallback.LENGTH`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tokentrail.core.ids import TokenIds
from tokentrail.errors import TemplateError
from tokentrail.kinds import Fallback, FinishReason
from tokentrail.messages import Message, ToolCall, ToolSchema
from tokentrail.text.chat_template import ChatTemplate
from tokentrail.text.families import Family, resolve_family
from tokentrail.text.tokenizer import LoadedTokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Spliced:
    """The result of one splice attempt: the prompt ids, or why there are none."""

    prompt_ids: npt.NDArray[np.uint32] | None
    fallback: Fallback | None = None
    glue: str = ""
    tail: str = ""
    # The text the template writes where the turn ended (the end token as history has it):
    # the full render ends with `end + glue + tail`. For a turn cut by its `max_tokens` it is
    # also in `prompt_ids`, after the sampled ids.
    end: str = ""


def _stub(message: Message) -> Message:
    # Without its reasoning, the last assistant message renders the same whether or not the
    # template strips reasoning before the last user message.
    stub: dict[str, Any] = {
        k: v for k, v in message.items() if k not in ("reasoning_content", "reasoning")
    }
    return stub  # type: ignore[return-value]  # a Message less some of its keys


# The synthetic context the glue is derived in: a query before the assistant turn (templates
# may refuse a conversation without one), and a longer one to show the tail does not depend on
# what came before.
_QUERY: Message = {"role": "user", "content": "Do the task."}
_EARLIER: list[Message] = [
    {"role": "user", "content": "Hello."},
    {"role": "assistant", "content": "Hello."},
]


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Splicer:
    """Derives glue and tail from a template and builds spliced prompt ids."""

    def __init__(
        self,
        tokenizer: LoadedTokenizer,
        template: str | None = None,
        family: Family | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template or tokenizer.chat_template
        self.family = family or resolve_family(tokenizer, template)
        self.chat = ChatTemplate(self.template, self.family.call_id)
        # What one render of the synthetic context tells about the template, kept: the
        # context's own render, the glue after a turn, and whether the text after a turn of
        # one shape depends on the messages before it.
        self._heads: dict[int, str] = {}
        self._glues: dict[tuple[str, bool], str] = {}
        self._independent: dict[tuple[str, int, tuple[str, ...]], bool] = {}

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema] | None,
        add_generation_prompt: bool,
        first_call_index: int = 0,
    ) -> str:
        return self.chat.render(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            first_call_index=first_call_index,
            **self.tokenizer.special_tokens_map,
        )

    def history_end(self, end_token: str) -> str:
        """The text the template writes in history where the model sampled `end_token`."""
        return self.family.history_end.get(end_token, end_token)

    def glue_and_tail(
        self,
        last_assistant: Message,
        end_token: str,
        new_messages: Sequence[Message],
        tools: Sequence[ToolSchema] | None,
        *,
        calls_before: int = 0,
        verified: bool = False,
    ) -> tuple[str, str] | Fallback:
        """The text after an assistant turn's end token: the glue, then the new messages and
        the generation prompt, derived from renders around a synthetic context.

        `calls_before`: the tool calls the conversation holds before `last_assistant`.
        `verified`: the caller checks the result against the full render. When it does not,
        the tail is checked not to depend on earlier messages (once per shape of turn).
        """
        stub = _stub(last_assistant)
        end = self.history_end(end_token)
        # Tools render once, before the conversation, in every template we know of: leaving
        # them out spares rendering every schema. The check against the full render (which
        # has them) catches a template where they matter.
        del tools
        shape = (end, len(stub.get("tool_calls") or ()), tuple(m["role"] for m in new_messages))
        try:
            rest = self._after_end([_QUERY], stub, end, new_messages, calls_before)
            if isinstance(rest, Fallback):
                return rest
            if not verified and shape not in self._independent:
                longer = [*_EARLIER, _QUERY]
                again = self._after_end(longer, stub, end, new_messages, calls_before)
                self._independent[shape] = again == rest
            if not self._independent.get(shape, True):
                return Fallback.NOT_PREFIX
            glue = self._glue(stub, end)
        except TemplateError:
            return Fallback.TEMPLATE_ERROR
        if not rest.startswith(glue):
            glue = ""
        return glue, rest[len(glue) :]

    def _head(self, context: list[Message]) -> str:
        """The synthetic context's own render (it holds no calls, so no ids to number)."""
        key = len(context)
        if key not in self._heads:
            self._heads[key] = self.render(context, None, False)
        return self._heads[key]

    def _glue(self, stub: Message, end: str) -> str:
        """What the template writes after a turn's end before anything follows it; a template
        whose end token starts the next message (GLM) writes none. It only names the part of
        the text after the end token that is not the new messages'."""
        key = (end, bool(stub.get("tool_calls")))
        if key not in self._glues:
            head = self._head([_QUERY])
            before = self.render([_QUERY, stub], None, False)
            cut = before.find(end, _common_prefix_len(head, before))
            self._glues[key] = before[cut + len(end) :] if cut >= 0 else ""
        return self._glues[key]

    def _after_end(
        self,
        context: list[Message],
        stub: Message,
        end: str,
        new_messages: Sequence[Message],
        calls_before: int,
    ) -> str | Fallback:
        """What follows the stub's end token when `context`, the stub and `new_messages` are
        rendered, or why that cannot be told."""
        head = self._head(context)
        full = self.render([*context, stub, *new_messages], None, True, calls_before)
        # The stub's turn starts where the render parts from the context alone (templates may
        # rewrite the end of a user turn once an answer follows it, as DeepSeek V3.2 does).
        start = _common_prefix_len(head, full)
        if start < len(head) and end in head[start:]:
            # The context's own end tokens changed: not a turn boundary that can be found.
            return Fallback.NOT_PREFIX
        content = stub.get("content")
        cut = full.find(end, start)
        if cut < 0:
            return Fallback.NO_BOUNDARY
        if isinstance(content, str) and content.strip() and full.find(content.strip(), start) > cut:
            return Fallback.NO_BOUNDARY
        return full[cut + len(end) :]

    def _ends_turn(self, output: TokenIds) -> bool:
        """Whether `output` ends with a stop token of the family (an engine may report a turn
        whose last token, at the budget, was its end as cut by the length limit)."""
        if not len(output):
            return False
        last = self.tokenizer.decode([int(output[-1])])
        ends = {*self.family.stop_tokens, self.family.end_after_text, self.family.end_after_calls}
        return last in ends and self.tokenizer.added_tokens.get(last) == int(output[-1])

    def splice(
        self,
        *,
        held_prompt: TokenIds,
        held_output: TokenIds,
        finish_reason: str | None,
        last_assistant: Message,
        new_messages: Sequence[Message],
        tools: Sequence[ToolSchema] | None,
        full_text: str | None,
        calls_before: int = 0,
        encode: Callable[[str], Sequence[int] | npt.NDArray[np.uint32]] | None = None,
    ) -> Spliced:
        """Prompt ids for the new messages after a generated turn, or a named fallback.

        `full_text` is the full render of the conversation; the spliced tail must be its suffix.
        None skips that check (the synthetic-context checks still run): see `TurnPipeline`.
        `calls_before`: the tool calls the conversation holds before `last_assistant`.
        `encode` tokenizes the new text (the tokenizer's own `encode` by default; the prompt
        builder passes the Rust core's, which gives the same ids).
        """
        cut = finish_reason == FinishReason.LENGTH and not self._ends_turn(held_output)
        if cut:
            # No end token was sampled: the template's end of the turn follows the sampled ids.
            end_token = self.family.end_token(last_assistant)
            if self.history_end(end_token) not in self.tokenizer.added_tokens:
                return Spliced(None, Fallback.LENGTH)
        else:
            if not len(held_output):
                return Spliced(None, Fallback.NO_END_TOKEN)
            end_id = int(held_output[-1])
            end_token = self.tokenizer.decode([end_id])
            if self.tokenizer.added_tokens.get(end_token) != end_id:
                return Spliced(None, Fallback.NO_END_TOKEN)
        end = self.history_end(end_token)
        derived = self.glue_and_tail(
            last_assistant,
            end_token,
            new_messages,
            tools,
            calls_before=calls_before,
            verified=full_text is not None,
        )
        if isinstance(derived, Fallback):
            return Spliced(None, derived)
        glue, tail = derived
        if full_text is not None and not full_text.endswith(end + glue + tail):
            return Spliced(None, Fallback.TAIL_MISMATCH, glue, tail, end)
        # The held tokens end with a special token (sampled, or the end appended to a cut
        # turn), where tokenization always splits, so the glue and tail tokenize the same here
        # as inside the full text.
        new = np.asarray(
            (encode or self.tokenizer.encode)((end if cut else "") + glue + tail), dtype=np.uint32
        )
        ids = np.concatenate(
            [np.asarray(held_prompt, np.uint32), np.asarray(held_output, np.uint32), new]
        )
        return Spliced(ids, None, glue, tail, end)


# -- checking a template ---------------------------------------------------------------------

_CALL: ToolCall = {"type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}
BOUNDARIES: dict[str, tuple[list[Message], list[Message]]] = {
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


def check_template(
    tokenizer: LoadedTokenizer, template: str | None = None, family: Family | None = None
) -> list[BoundaryReport]:
    """For each boundary: is the template prefix-preserving there, can a turn be spliced, and
    with what glue after the assistant's end token (the one the family's model samples)."""
    splicer = Splicer(tokenizer, template, family)
    system: list[Message] = [{"role": "system", "content": "You are terse."}]
    reports = []
    for name, (history, new) in BOUNDARIES.items():
        # The boundary as the family's model writes it (gpt-oss and Llama: one call a turn),
        # followed by one result per call.
        last = splicer.family.representable(history[-1])
        history = [*system, *history[:-1], last]
        if all(m["role"] == "tool" for m in new):
            new = new[: len(last.get("tool_calls") or ())]
        end = splicer.family.end_token(last)
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
        ok = full.endswith(splicer.history_end(end) + glue + tail)
        reports.append(
            BoundaryReport(
                name, full.startswith(before), ok, glue, None if ok else Fallback.TAIL_MISMATCH
            )
        )
    return reports
