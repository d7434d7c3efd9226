"""The internal message format: what chat templates render and the routing tree records.

Every wire protocol translates its request into a `Conversation` of `Message`s (OpenAI-style
chat-template messages: tool-call arguments as dicts, no ids, no wire-only keys) and its tools
into `ToolSchema`s; everything below the adapter speaks only this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from tokentrail.kinds import ToolChoice

Role = Literal["system", "user", "assistant", "tool"]


class FunctionCall(TypedDict):
    name: str
    # A dict inside. `{"_raw_arguments": text}` in turns journaled before arguments that are
    # not a JSON object were refused (they still render as that text).
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


class _RequiredFunctionSchema(TypedDict):
    name: str
    parameters: dict[str, Any]


class FunctionSchema(_RequiredFunctionSchema, total=False):
    # Optional (`NotRequired` is 3.11+; a total=False subclass says the same on 3.10).
    description: str


class ToolSchema(TypedDict):
    type: Literal["function"]
    function: FunctionSchema


@dataclass
class Conversation:
    """A request in tokentrail's terms: chat-template messages and OpenAI-style tools, what it
    lets the model do with them, and what translation could not keep."""

    messages: list[Message]
    tools: list[ToolSchema] | None
    tool_choice: ToolChoice = ToolChoice.AUTO
    # With `ToolChoice.REQUIRED`: the one tool the model must call (None: any of them).
    forced_tool: str | None = None
    # Typed tools the harness does not run itself (server tools such as `web_search`): not
    # offered to the model, named here.
    withheld_tools: list[str] = field(default_factory=list)
    # Images, documents and other media rendered as a placeholder, by kind.
    dropped_media: dict[str, int] = field(default_factory=dict)
    # The first this-many messages are the very objects of the session's previous
    # conversation, unchanged since (the adapter's reusing parse vouches for it): what the
    # pipeline worked out for them last turn holds. 0: nothing is assumed.
    unchanged: int = 0


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
