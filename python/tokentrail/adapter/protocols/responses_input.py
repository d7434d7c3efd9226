"""OpenAI Responses input on the way in: a request's flat list of items, and its tools, as
chat-template messages and tools (`adapter.protocols.responses` is the protocol).

Assistant-side items in a row (`reasoning`, an assistant `message`, `function_call`,
`custom_tool_call`) are one assistant message; the outputs that follow answer its calls by
`call_id` and are ordered as the calls are. Free-form `custom` tools (Codex's `apply_patch`) are
offered to the model as a function with one string parameter; `namespace` tools are flattened as
`NAMESPACE.NAME`. Server-side tools (`web_search`, `tool_search`, ...) are not offered: nothing
would run them. Reasoning is read from our `encrypted_content` first (clients with
`store: false` send it back untouched).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from tokentrail.adapter.protocols.content import ContentReader, append_system_note
from tokentrail.adapter.protocols.openai import parse_arguments
from tokentrail.adapter.protocols.resume import Fold, Translated
from tokentrail.adapter.protocols.tools import DeclaredTools, tool_choice, tool_schema
from tokentrail.errors import RequestError
from tokentrail.kinds import ToolChoice
from tokentrail.messages import Conversation, Message, ToolCall, ToolSchema

ROLES = ("developer", "system", "user", "assistant")
TEXT = ("input_text", "output_text", "text", "refusal")
MEDIA = {"input_image": "image", "input_file": "document", "input_audio": "audio"}
TOOL_CHOICES = {"auto": ToolChoice.AUTO, "none": ToolChoice.NONE, "required": ToolChoice.REQUIRED}
# The one parameter a free-form tool's input travels in, inside.
CUSTOM_INPUT = "input"
# Tools the provider runs itself: offering them to the model would produce calls nobody runs.
SERVER_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "tool_search",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer_use_preview",
        "mcp",
        "local_shell",
    }
)
# History items those tools leave behind; rendered as text, never refused.
SERVER_ITEMS = frozenset(
    {
        "web_search_call",
        "tool_search_call",
        "tool_search_output",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
        "mcp_call",
        "mcp_list_tools",
    }
)
ASSISTANT_ITEMS = frozenset({"reasoning", "function_call", "custom_tool_call"})
OUTPUT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output"})


@dataclass
class ToolTable:
    """How a request's tools map to the functions the template renders, and back."""

    schemas: list[ToolSchema] = field(default_factory=list)
    custom: set[str] = field(default_factory=set)
    # Flattened name -> (namespace, name on the wire).
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    withheld: list[str] = field(default_factory=list)


def internal_name(name: str, namespace: object) -> str:
    """A namespaced function's name inside: `NAMESPACE.NAME` (see `read_tools`)."""
    return f"{namespace}.{name}" if isinstance(namespace, str) and namespace else name


def read_tools(tools: object) -> ToolTable:
    table = ToolTable()
    if tools is None:
        return table
    if not isinstance(tools, list):
        raise RequestError("tools must be a list")
    for pos, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise RequestError(f"tools[{pos}] must be an object")
        kind = tool.get("type")
        if kind == "function":
            table.schemas.append(
                tool_schema(pos, tool.get("name"), tool.get("description"), tool.get("parameters"))
            )
        elif kind == "custom":
            name = tool.get("name")
            schema = {
                "type": "object",
                "properties": {CUSTOM_INPUT: {"type": "string"}},
                "required": [CUSTOM_INPUT],
            }
            table.schemas.append(tool_schema(pos, name, tool.get("description"), schema))
            table.custom.add(str(name))
        elif kind == "namespace":
            space, members = tool.get("name"), tool.get("tools")
            if not isinstance(space, str) or not isinstance(members, list):
                raise RequestError(f"tools[{pos}]: a namespace needs a name and a list of tools")
            for sub, member in enumerate(members):
                if not isinstance(member, dict) or member.get("type") != "function":
                    raise RequestError(f"tools[{pos}].tools[{sub}] must be a function tool")
                name = member.get("name")
                flat = f"{space}.{name}"
                table.schemas.append(
                    tool_schema(pos, flat, member.get("description"), member.get("parameters"))
                )
                table.namespaced[flat] = (space, str(name))
        elif kind in SERVER_TOOLS:
            table.withheld.append(str(kind))
        else:
            raise RequestError(f"tools[{pos}]: unsupported tool type {kind!r}")
    return table


def _reasoning_text(item: Mapping[str, Any], where: str, reader: ContentReader) -> str:
    """The raw reasoning of an item: our `encrypted_content` first, then its content, then its
    summary (all a client that never saw our reply can send)."""
    encrypted = item.get("encrypted_content")
    if isinstance(encrypted, str) and encrypted:
        return encrypted
    for key, kind, joiner in (
        ("content", "reasoning_text", ""),
        ("summary", "summary_text", "\n\n"),
    ):
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            return joiner.join(reader.text([p], f"{where}.{key}") for p in parts if _is(p, kind))
    return ""


def _is(part: object, kind: str) -> bool:
    return isinstance(part, dict) and part.get("type") in (kind, "text")


class _Builder:
    """Collects input items into messages, one assistant message per run of assistant items.

    A message in the list is never changed in place: the open assistant message is replaced
    by an updated copy (`_update`), so a resume mark (`protocols.resume`) that holds it keeps
    it as it stood.
    """

    def __init__(self, fold: Fold) -> None:
        self.fold = fold
        self.results = fold.results
        self.reader = fold.reader
        self.messages = fold.messages
        # Whether the last message is an assistant message items are still adding to, and
        # the ids of its calls so far.
        self._open = False
        self._call_ids: tuple[str, ...] = ()

    def mark(self) -> None:
        """A resume mark after the item just read."""
        self.fold.mark((self._open, self._call_ids))

    def resumed(self) -> None:
        """Take the state of the mark the fold resumed from."""
        self._open, self._call_ids = self.fold.marks[-1].extra

    def _open_assistant(self) -> Message:
        if not self._open:
            self.messages.extend(self.results.flush())
            self.messages.append({"role": "assistant", "content": ""})
            self._open = True
            self._call_ids = ()
        return self.messages[-1]

    def _update(self, **changes: Any) -> None:
        """The open assistant message, updated (a copy takes its place)."""
        self.messages[-1] = cast(Message, {**self.messages[-1], **changes})

    def _close_assistant(self) -> None:
        if self._open:
            self.results.open(self._call_ids)
            self.fold.note_calls(self._call_ids)
            self._open = False

    def system(self, text: str) -> None:
        self._close_assistant()
        self.messages.extend(self.results.flush())
        if not self.messages:
            self.messages.append({"role": "system", "content": text})
        elif len(self.messages) == 1 and self.messages[0]["role"] == "system":
            # Codex sends its instructions as several developer messages up front.
            first = self.messages[0]
            self.messages[0] = {**first, "content": f"{first['content']}\n\n{text}"}
        else:
            append_system_note(self.messages, text)

    def user(self, text: str) -> None:
        self._close_assistant()
        self.messages.extend(self.results.flush())
        self.results.close_all()
        self.messages.append({"role": "user", "content": text})

    def reasoning(self, text: str) -> None:
        msg = self._open_assistant()
        if self._call_ids or msg.get("content"):
            # Reasoning after visible output starts the next assistant message.
            self._close_assistant()
            msg = self._open_assistant()
        if text:
            previous = msg.get("reasoning_content")
            self._update(reasoning_content=f"{previous}\n{text}" if previous else text)

    def assistant_text(self, text: str) -> None:
        msg = self._open_assistant()
        self._update(content=msg.get("content", "") + text)

    def call(self, name: str, arguments: dict[str, Any], call_id: object, where: str) -> None:
        if not isinstance(call_id, str) or not call_id:
            raise RequestError(f"{where}: a tool call needs a string call_id")
        msg = self._open_assistant()
        call: ToolCall = {"type": "function", "function": {"name": name, "arguments": arguments}}
        self._update(tool_calls=[*msg.get("tool_calls", ()), call])
        self._call_ids = (*self._call_ids, call_id)

    def output(self, call_id: object, text: str, where: str) -> None:
        """A tool result; results are put in the order of the calls they answer."""
        self._close_assistant()
        self.results.answer(call_id, {"role": "tool", "content": text}, where, "tool output")

    def server_item(self, item: Mapping[str, Any]) -> None:
        note = json.dumps({k: v for k, v in item.items() if k != "id"}, ensure_ascii=False)
        self.assistant_text(f"[{item.get('type')}: {note}]")

    def finish(self) -> list[Message]:
        self._close_assistant()
        self.messages.extend(self.results.flush())
        return self.messages


def _tool_choice(body: Mapping[str, Any], tools: ToolTable) -> tuple[ToolChoice, str | None]:
    choice = body.get("tool_choice")
    declared = DeclaredTools(tools.schemas or None, tools.withheld)
    if choice is None:
        return ToolChoice.AUTO, None
    if isinstance(choice, str) and choice in TOOL_CHOICES:
        return tool_choice(TOOL_CHOICES[choice], None, declared)
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        name = choice.get("name")
        if isinstance(name, str) and isinstance(choice.get("namespace"), str):
            name = f"{choice['namespace']}.{name}"
        return tool_choice(ToolChoice.REQUIRED, name, declared)
    raise RequestError(
        "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}"
    )


def translate_request(
    body: Mapping[str, Any],
    prior: list[Message] | None = None,
    prior_calls: list[str] | None = None,
) -> tuple[Conversation, ToolTable]:
    """A Responses request to chat-template messages and tools; `prior` is the conversation a
    `previous_response_id` continues (its last message the response), `prior_calls` that
    response's call ids."""
    tools = read_tools(body.get("tools"))
    return translate_from(body, None, 0, prior, prior_calls, tools).conversation, tools


def _declared(body: Mapping[str, Any], tools: ToolTable | None = None) -> Conversation:
    """The request's tools and tool choice (no messages yet)."""
    tools = read_tools(body.get("tools")) if tools is None else tools
    choice, forced = _tool_choice(body, tools)
    return Conversation([], tools.schemas or None, choice, forced, tools.withheld)


def translate_from(
    body: Mapping[str, Any],
    previous: Translated | None,
    at: int,
    prior: list[Message] | None = None,
    prior_calls: list[str] | None = None,
    tools: ToolTable | None = None,
) -> Translated:
    """`translate_request`, resuming `previous` before input item `at` when it can (see
    `tokentrail.adapter.protocols.resume`); a continued conversation (`prior`) never
    resumes."""
    fold = Fold(ContentReader(TEXT, MEDIA))
    if prior:
        previous = None
    declared, at = fold.start(previous, at, partial(_declared, body, tools))
    builder = _Builder(fold)
    if at:
        builder.resumed()
    elif prior:
        builder.messages.extend(prior)
        fold.results.open(prior_calls or [])
    instructions = body.get("instructions")
    if at == 0 and instructions is not None and not prior:
        if not isinstance(instructions, str):
            raise RequestError("instructions must be a string")
        if instructions:
            builder.system(instructions)
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise RequestError("input must be a string or a list of items")
    for pos in range(at, len(raw)):
        _read_item(builder, raw[pos], f"input[{pos}]")
        builder.mark()
    builder.finish()
    if not fold.messages:
        raise RequestError("input must not be empty")
    return fold.translated(declared)


def _read_item(builder: _Builder, item: object, where: str) -> None:
    if not isinstance(item, dict):
        raise RequestError(f"{where} must be an object")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role must be one of {ROLES}, got {role!r}")
        text = builder.reader.text(item.get("content", ""), f"{where}.content")
        if role == "assistant":
            builder.assistant_text(text)
        elif role == "user":
            builder.user(text)
        else:
            builder.system(text)
    elif kind == "reasoning":
        builder.reasoning(_reasoning_text(item, where, builder.reader))
    elif kind == "function_call":
        name = item.get("name")
        if not isinstance(name, str):
            raise RequestError(f"{where}: function_call needs a string name")
        internal = internal_name(name, item.get("namespace"))
        arguments = parse_arguments(item.get("arguments", "{}"), f"{where}.arguments")
        builder.call(internal, arguments, item.get("call_id"), where)
    elif kind == "custom_tool_call":
        tool, patch = item.get("name"), item.get("input")
        if not isinstance(tool, str) or not isinstance(patch, str):
            raise RequestError(f"{where}: custom_tool_call needs a string name and input")
        builder.call(tool, {CUSTOM_INPUT: patch}, item.get("call_id"), where)
    elif kind in OUTPUT_ITEMS:
        output = builder.reader.text(item.get("output", ""), f"{where}.output")
        builder.output(item.get("call_id"), output, where)
    elif kind in SERVER_ITEMS:
        builder.server_item(item)
    else:
        raise RequestError(f"{where}: unsupported input item type {kind!r}")
