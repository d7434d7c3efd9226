"""slime's `slime.agent.adapters.anthropic`: the adapter, and the module's helpers under slime's
names and signatures, each doing what the drop-in adapter does by default (tokentrail's Anthropic
Messages protocol reading the wire as slime's does, `SLIME_WIRE`; where it still differs from
slime's, docs/integrations/slime.md lists it).
"""

from __future__ import annotations

from typing import Any, Protocol

from multidict import CIMultiDict

from tokentrail.adapter.protocols.anthropic import (
    AnthropicMessages,
    declared_tools,
    translate_request,
)
from tokentrail.adapter.protocols.options import system_reminder
from tokentrail.integrations.slime.adapters import SLIME_WIRE, AnthropicAdapter
from tokentrail.integrations.slime.common import flatten_content
from tokentrail.messages import Message, ToolSchema


class HasHeaders(Protocol):
    """What the session rule reads of a request."""

    @property
    def headers(self) -> Any: ...


def _request_session_id(request: HasHeaders) -> str:
    """The session a Messages request belongs to: its API key (`Authorization: Bearer` or
    `x-api-key`). Raises `AuthenticationError` without one, `RequestError` when the two name
    different sessions."""
    return AnthropicMessages().session_id(CIMultiDict(request.headers), {})


def _translate_messages(msgs: list[dict[str, Any]], system: Any) -> list[Message]:
    """Messages and a system prompt as the chat-template messages the adapter renders (with
    its default switches: a tool_use without an id answered by position, a mid-list `system`
    message as slime's `<system-reminder>` user message)."""
    body: dict[str, Any] = {"messages": msgs}
    if system:
        body["system"] = system
    return translate_request(body, SLIME_WIRE).messages


def _tools_to_chat_tools(anth_tools: list[dict[str, Any]] | None) -> list[ToolSchema] | None:
    """Anthropic tool declarations as the chat template's (OpenAI-style) tools."""
    if not anth_tools:
        return None
    return declared_tools({"tools": anth_tools})


def _fold_mid_list_system_into_user(body_obj: dict[str, Any]) -> bool:
    """Every `system` message after the first position, wrapped in slime's `<system-reminder>`
    tags, made a text block of the user message right before it (or a user message of its
    own), in place; True when one was folded. The drop-in adapter does not fold the body: it
    renders each such message as a `<system-reminder>` user message of its own, which is
    where slime's translation of the folded block puts it (slime makes each text block of a
    user message a message)."""
    msgs = body_obj.get("messages")
    if not isinstance(msgs, list) or not any(
        isinstance(m, dict) and m.get("role") == "system" for m in msgs[1:]
    ):
        return False
    out: list[Any] = []
    for pos, m in enumerate(msgs):
        if pos == 0 or not isinstance(m, dict) or m.get("role") != "system":
            out.append(m)
            continue
        note = {"type": "text", "text": system_reminder(flatten_content(m.get("content")))}
        prev = out[-1] if out else None
        if isinstance(prev, dict) and prev.get("role") == "user":
            content = prev.get("content")
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
            out[-1] = {**prev, "content": [*blocks, note]}
        else:
            out.append({"role": "user", "content": [note]})
    body_obj["messages"] = out
    return True


__all__ = ["AnthropicAdapter"]
