"""slime's `slime.agent.adapters.openai`: the adapter, and the module's helpers under slime's
names and signatures, each doing what tokentrail's OpenAI Chat Completions protocol does (where
that differs from slime's, docs/integrations/slime.md lists it).
"""

from __future__ import annotations

from typing import Any

from multidict import CIMultiDict

from tokentrail.adapter.protocols.openai import OpenAIChat, declared_tools, translate_request
from tokentrail.integrations.slime.adapters import OpenAIAdapter
from tokentrail.integrations.slime.anthropic import HasHeaders
from tokentrail.messages import Message, ToolSchema


def _request_session_id(request: HasHeaders, body: dict[str, Any]) -> str:
    """The session a Chat Completions request belongs to: its bearer token (the body names no
    session unless the adapter's `AdapterConfig(session_from_body=True)`). Raises
    `AuthenticationError` without one."""
    return OpenAIChat().session_id(CIMultiDict(request.headers), body)


def _translate_messages(messages: list[dict[str, Any]]) -> list[Message]:
    """Chat Completions messages as the chat-template messages the adapter renders."""
    return translate_request({"messages": messages}).messages


def _tools_to_chat_tools(tools: list[dict[str, Any]] | None) -> list[ToolSchema] | None:
    """Chat Completions tool declarations as the chat template's tools."""
    if not tools:
        return None
    return declared_tools({"tools": tools})


__all__ = ["OpenAIAdapter"]
