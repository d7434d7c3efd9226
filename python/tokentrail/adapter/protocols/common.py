"""What every wire protocol shares: the `WireProtocol` interface and its registry, and the
translation helpers each protocol would otherwise write again (text of content blocks, tool
schemas, tool-result matching, sampling keys, the mid-list `system` rule, ids, SSE pieces).
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from tokentrail.errors import AuthenticationError, RequestError
from tokentrail.messages import Conversation, Message, ToolSchema, function_tool

IMAGE_PLACEHOLDER = "[image]"
# How many characters one streamed delta carries.
STREAM_CHUNK = 64


@dataclass
class Outcome:
    """A finished turn as a protocol writes it back: the parsed message and its numbers."""

    model: str
    message: Message
    # Fresh ids for the message's tool calls, in order (minted by the protocol).
    call_ids: list[str]
    finish_reason: str
    prompt_tokens: int
    output_tokens: int
    # Prompt tokens reused from the session's held prefix (a splice).
    cached_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class WireProtocol(ABC):
    """One wire protocol: its routes, translation, sampling keys, replies, SSE and errors."""

    name: ClassVar[str]
    # The route that runs a turn, and the one that counts a request's tokens (if any).
    turn_path: ClassVar[str]
    count_tokens_path: ClassVar[str | None] = None
    # Paths whose errors are written in this protocol's shape.
    path_prefixes: ClassVar[tuple[str, ...]]

    def session_id(
        self, headers: Mapping[str, str], body: Mapping[str, Any], *, trust_body: bool = False
    ) -> str:
        """The session a request belongs to: the credential it carries (the API key).

        A protocol may also name the session in the body, read only when `trust_body` (the
        operator's `--session-from-body`): otherwise any client could write into any session.
        """
        sid = bearer(headers) or headers.get("x-api-key")
        if not sid:
            raise AuthenticationError(
                "no session id: send it as the API key (Authorization: Bearer or x-api-key)"
            )
        return sid

    @abstractmethod
    def translate(self, body: dict[str, Any]) -> Conversation:
        """The request's messages and tools in tokentrail's terms."""

    @abstractmethod
    def sampling(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The request's sampling overrides, as `SamplingParams` field names."""

    def stream_requested(self, body: Mapping[str, Any]) -> bool:
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("stream must be a boolean")
        return stream

    @abstractmethod
    def mint_call_id(self) -> str:
        """A fresh id for one tool call of a reply."""

    @abstractmethod
    def reply(self, outcome: Outcome) -> dict[str, Any]:
        """The JSON body of a non-streamed reply."""

    @abstractmethod
    def stream(self, reply: dict[str, Any], body: Mapping[str, Any]) -> Iterator[bytes]:
        """The SSE frames of a streamed reply, from the same body `reply` built."""

    @abstractmethod
    def error_body(self, status: int, kind: str, message: str) -> dict[str, Any]:
        """The protocol's JSON error shape."""

    def count_tokens_reply(self, tokens: int) -> dict[str, Any]:
        return {"input_tokens": tokens}


P = TypeVar("P", bound=type[WireProtocol])
_REGISTRY: dict[str, WireProtocol] = {}


def register_protocol(cls: P) -> P:
    """Class decorator: serve this protocol (one instance) on its routes."""
    _REGISTRY[cls.name] = cls()
    return cls


def protocols() -> list[WireProtocol]:
    return list(_REGISTRY.values())


def protocol_for_path(path: str) -> WireProtocol | None:
    """The protocol whose error shape a path's answers use, by the longest matching prefix."""
    best: tuple[int, WireProtocol] | None = None
    for proto in _REGISTRY.values():
        for prefix in proto.path_prefixes:
            if path.startswith(prefix) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), proto)
    return best[1] if best else None


# -- credentials ----------------------------------------------------------------------------------


def bearer(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        token = auth[7:].strip()
        return token or None
    return None


def mint_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


# -- messages -------------------------------------------------------------------------------------


def text_of(
    content: object,
    where: str,
    *,
    text_types: Collection[str],
    image_types: Collection[str],
    allow_null: bool = False,
) -> str:
    """Text of a string or of a list of content parts: text parts joined by newlines, image
    and document parts as `IMAGE_PLACEHOLDER`; any other part is refused."""
    if content is None and allow_null:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        expected = "a string, null or a list" if allow_null else "a string or a list"
        raise RequestError(f"{where} must be {expected} of content blocks")
    return "\n".join(
        part_text(block, f"{where}[{pos}]", text_types=text_types, image_types=image_types)
        for pos, block in enumerate(content)
    )


def part_text(
    block: object, where: str, *, text_types: Collection[str], image_types: Collection[str]
) -> str:
    """The text of one content part: its `text`, or `IMAGE_PLACEHOLDER` for an image or a
    document; any other part is refused."""
    if not isinstance(block, dict):
        raise RequestError(f"{where} must be a content block object")
    kind = block.get("type")
    if kind in text_types:
        if not isinstance(block.get("text"), str):
            raise RequestError(f"{where}.text must be a string")
        return str(block["text"])
    if kind in image_types:
        return IMAGE_PLACEHOLDER
    raise RequestError(f"{where}: unsupported block type {kind!r} here")


def tool_schema(pos: int, name: object, description: object, schema: object) -> ToolSchema:
    """One declared tool, checked: a string name and an object schema."""
    if not isinstance(name, str):
        raise RequestError(f"tools[{pos}] must have a string name")
    if schema is None:
        schema = {"type": "object", "properties": {}}
    if not isinstance(schema, dict):
        raise RequestError(f"tools[{pos}]: the parameter schema must be an object")
    return function_tool(name, description, schema)


def translate_tools(
    tools: object, read: Callable[[int, Any], ToolSchema]
) -> list[ToolSchema] | None:
    """A request's tool list through the protocol's `read(pos, tool)`; None when absent."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list")
    return [read(pos, tool) for pos, tool in enumerate(tools)]


def wire_messages(
    body: Mapping[str, Any], roles: Collection[str]
) -> Iterator[tuple[str, dict[str, Any], str]]:
    """The request's `messages`, checked: a non-empty list of objects with a known role.
    Yields (where, message, role), `where` naming the message in errors."""
    raw = body.get("messages")
    if not isinstance(raw, list):
        raise RequestError("messages must be a list")
    if not raw:
        raise RequestError("messages must not be empty")
    for pos, m in enumerate(raw):
        where = f"messages[{pos}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object")
        role = m.get("role")
        if role not in roles:
            raise RequestError(f"{where}.role must be one of {tuple(roles)}, got {role!r}")
        yield where, m, str(role)


class OpenCalls:
    """The tool-call ids of the latest assistant message, which tool results must answer."""

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def open(self, ids: Collection[str]) -> None:
        self._ids = set(ids)

    def close_all(self) -> None:
        self._ids = set()

    def answer(self, call_id: object, where: str, what: str) -> None:
        """A tool result for `call_id`; refused when no open call has that id."""
        if not isinstance(call_id, str) or call_id not in self._ids:
            raise RequestError(
                f"{where}: {what} for {call_id!r} has no matching tool call in the previous "
                "assistant message"
            )
        self._ids.discard(call_id)


def append_system_note(messages: list[Message], text: str) -> None:
    """A `system` message after the start becomes user text.

    Every chat template renders user turns, not all render a system turn after the first, so
    the note joins the user message before it (or becomes one of its own).
    """
    if messages and messages[-1]["role"] == "user":
        prev = messages[-1]
        messages[-1] = {**prev, "content": f"{prev['content']}\n\n{text}"}
    else:
        messages.append({"role": "user", "content": text})


# -- sampling -------------------------------------------------------------------------------------


def _number(body: Mapping[str, Any], key: str, integer: bool) -> Any:
    value = body.get(key)
    if value is None:
        return None
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise RequestError(f"{key} must be an int" if integer else f"{key} must be a number")
    return value


def _stops(value: object, key: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise RequestError(f"{key} must be a string or a list of strings")


def sampling_keys(body: Mapping[str, Any], max_key: str, stop_key: str) -> dict[str, Any]:
    """The sampling keys protocols share, read from `body`: the output limit (named
    `max_key`), temperature, top_p, top_k, stop strings (named `stop_key`) and seed."""
    out: dict[str, Any] = {}
    max_tokens = _number(body, max_key, integer=True)
    if max_tokens is not None:
        if max_tokens < 1:
            raise RequestError(f"{max_key} must be >= 1")
        out["max_new_tokens"] = max_tokens
    for key in ("temperature", "top_p"):
        value = _number(body, key, integer=False)
        if value is not None:
            out[key] = float(value)
    top_k = _number(body, "top_k", integer=True)
    if top_k is not None:
        out["top_k"] = top_k
    stops = _stops(body.get(stop_key), stop_key)
    if stops is not None:
        out["stop"] = stops
    seed = _number(body, "seed", integer=True)
    if seed is not None:
        out["seed"] = seed
    return out


# -- streaming ------------------------------------------------------------------------------------


def pieces(text: str, size: int = STREAM_CHUNK) -> list[str]:
    """`text` in deltas of `size` characters; none for empty text."""
    return [text[i : i + size] for i in range(0, len(text), size)]


__all__ = [
    "IMAGE_PLACEHOLDER",
    "Conversation",
    "OpenCalls",
    "Outcome",
    "WireProtocol",
    "append_system_note",
    "bearer",
    "mint_id",
    "part_text",
    "pieces",
    "protocol_for_path",
    "protocols",
    "register_protocol",
    "sampling_keys",
    "text_of",
    "tool_schema",
    "translate_tools",
    "wire_messages",
]
