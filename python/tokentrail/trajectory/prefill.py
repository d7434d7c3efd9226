"""Assistant prefill: a request whose last message is a partial assistant turn for the model to
continue (Anthropic's prefill), instead of a closed turn followed by a new one.

The prompt ends with the partial text as the template renders it, without the end-of-turn token;
the model's tokens continue it. The recorded reply is the whole message (prefill and
continuation), the prefill's tokens are prompt (context, never trained) and the sampled ones
train. An empty or whitespace-only trailing assistant message (hermes-agent sends one after a
reply that was all reasoning) is no prefill: it is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokentrail.errors import RequestError, TemplateError
from tokentrail.messages import Message, ToolSchema

__all__ = ["Prefill", "continuation", "prefill_text", "split_prefill"]

Render = Callable[[Sequence[Message], Sequence[ToolSchema] | None, bool], str]


@dataclass(frozen=True)
class Prefill:
    """The partial assistant message a turn continues, and its rendering."""

    message: Message
    # What the model would have written for it: the template's assistant turn after the
    # generation prompt, up to (not including) the end-of-turn token.
    text: str
    # The whole prompt: the conversation before it, the generation prompt, then `text`.
    prompt: str


def _empty(message: Message) -> bool:
    return (
        message.get("role") == "assistant"
        and not message.get("tool_calls")
        and not str(message.get("reasoning_content") or "").strip()
        and not str(message.get("content") or "").strip()
    )


def split_prefill(messages: Sequence[Message]) -> tuple[list[Message], Message | None]:
    """The conversation before the prefill, and the prefill (None when there is none).

    Trailing empty assistant messages are dropped first (at most what follows the last
    non-assistant message). A prefill that holds tool calls cannot be continued: refused.
    """
    context = list(messages)
    while context and _empty(context[-1]):
        context.pop()
    if not context or context[-1].get("role") != "assistant":
        return context, None
    prefill = context.pop()
    if prefill.get("tool_calls"):
        raise RequestError(
            "the last message is an assistant message with tool calls and no results: "
            "send the tool results, or end with a user message"
        )
    return context, prefill


def prefill_text(
    render: Render,
    context: Sequence[Message],
    prefill: Message,
    tools: Sequence[ToolSchema] | None,
    end_token: str,
) -> Prefill:
    """Render `context` with the generation prompt, then the prefill's text as the template
    writes that assistant turn, cut before its end-of-turn token.

    Refused (`RequestError`) when the template's rendering of the turn does not begin with its
    generation prompt or has no end token to cut at: the prompt could not be a prefix of what
    the model would have written.
    """
    try:
        opened = render(context, tools, True)
        full = render([*context, prefill], tools, False)
    except TemplateError as exc:
        raise RequestError(f"the chat template refused the prefill: {exc}") from None
    end = full.rfind(end_token)
    if not full.startswith(opened) or end < len(opened):
        raise RequestError(
            "this chat template cannot continue an assistant prefill: its rendering of the "
            "last assistant message does not start with the generation prompt"
        )
    return Prefill(prefill, full[len(opened) : end], full[:end])


def continuation(whole: Message, prefill: Message) -> Message | None:
    """What the model added to `prefill`, as a message of its own: the reply a harness gets
    (the Anthropic API answers a prefill with the continuation only). None when `whole` does
    not begin with the prefill's text (the output was parsed differently)."""
    reply: Message = {"role": "assistant"}
    for key in ("content", "reasoning_content"):
        head = str(prefill.get(key) or "")
        text = str(whole.get(key) or "")
        if not text.startswith(head):
            return None
        if key == "content" or text[len(head) :]:
            reply[key] = text[len(head) :]
    if whole.get("tool_calls"):
        reply["tool_calls"] = whole["tool_calls"]
    return reply
