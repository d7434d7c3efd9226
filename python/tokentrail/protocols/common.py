"""What both wire protocols share: the translated request and the mid-list `system` rule."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any


@dataclass
class Translated:
    """A request in tokentrail's terms: chat-template messages and OpenAI-style tools."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


def append_system_note(messages: list[dict[str, Any]], text: str) -> None:
    """A `system` message after the start becomes user text.

    Every chat template renders user turns, not all render a system turn after the first, so
    the note joins the user message before it (or becomes one of its own).
    """
    if messages and messages[-1]["role"] == "user":
        prev = messages[-1]
        messages[-1] = {**prev, "content": f"{prev['content']}\n\n{text}"}
    else:
        messages.append({"role": "user", "content": text})


def mint_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def function_tool(name: str, description: object, parameters: dict[str, Any]) -> dict[str, Any]:
    """A tool in the OpenAI shape tokentrail uses inside, whichever protocol declared it."""
    function: dict[str, Any] = {"name": name, "parameters": parameters}
    if isinstance(description, str):
        function["description"] = description
    return {"type": "function", "function": function}
