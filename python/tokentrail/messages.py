"""The internal message format: what chat templates render and the routing tree records.

Every wire protocol translates its request into a `Conversation` of `Message`s (OpenAI-style
chat-template messages: tool-call arguments as dicts, no ids, no wire-only keys) and its tools
into `ToolSchema`s; everything below the adapter speaks only this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

Role = Literal["system", "user", "assistant", "tool"]


class FunctionCall(TypedDict):
    name: str
    # A dict inside; `{"_raw_arguments": text}` when the wire carried a string that is not a
    # JSON object.
    arguments: dict[str, Any]


class ToolCall(TypedDict):
    type: Literal["function"]
    function: FunctionCall


class Message(TypedDict, total=False):
    role: Role
    content: str
    reasoning_content: str
    tool_calls: list[ToolCall]
    # On tool messages: the result reports a failure.
    is_error: bool


class FunctionSchema(TypedDict):
    name: str
    parameters: dict[str, Any]
    description: NotRequired[str]


class ToolSchema(TypedDict):
    type: Literal["function"]
    function: FunctionSchema


@dataclass
class Conversation:
    """A request in tokentrail's terms: chat-template messages and OpenAI-style tools."""

    messages: list[Message]
    tools: list[ToolSchema] | None


def function_tool(name: str, description: object, parameters: dict[str, Any]) -> ToolSchema:
    """A tool in the shape tokentrail uses inside, whichever protocol declared it."""
    function: FunctionSchema = {"name": name, "parameters": parameters}
    if isinstance(description, str):
        function["description"] = description
    return {"type": "function", "function": function}


def tool_names(message: Message | dict[str, Any] | None) -> list[str]:
    """The names of a message's tool calls, in order."""
    if not message:
        return []
    names = []
    for call in message.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names
