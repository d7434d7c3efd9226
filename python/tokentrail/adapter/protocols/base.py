"""What every wire protocol shares: the `WireProtocol` interface and its registry, and the
translation helpers each protocol would otherwise write again (text of content blocks, tool
schemas, tool-result matching, sampling keys, the mid-list `system` rule, ids, SSE pieces).
"""

from __future__ import annotations

import copy
import json
import secrets
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from tokentrail.adapter.protocols.fields import Spec
from tokentrail.adapter.protocols.options import (
    DEFAULT_WIRE,
    REMINDER_CLOSE,
    REMINDER_OPEN,
    WireOptions,
    system_reminder,
)
from tokentrail.adapter.protocols.tool_results import ToolResults
from tokentrail.errors import AuthenticationError, RequestError
from tokentrail.kinds import ToolChoice
from tokentrail.messages import Conversation, ImageSource, Message, ToolSchema, function_tool
from tokentrail.text.stream_parsing import StreamDeltas
from tokentrail.text.vision import IMAGE_PLACEHOLDER, image_mark, image_source

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
    # Output tokens spent on reasoning.
    reasoning_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    # The reply's id (`WireProtocol.mint_reply_id`) and the request it answers.
    reply_id: str = ""
    body: Mapping[str, Any] = field(default_factory=dict)
    # (text, logprob) of each sampled token of the reply, when the request asked for them
    # (`WireProtocol.wants_logprobs`); None when it did not.
    token_logprobs: list[tuple[str, float]] | None = None
    # Ids of the reply's parts (Responses' output items) by key: a live stream's, already sent.
    item_ids: dict[str, str] = field(default_factory=dict)


def fill_call_ids(proto: WireProtocol, given: list[str], count: int) -> list[str]:
    """The ids of a reply's `count` tool calls: those in `given` (a live stream sent them),
    then fresh ones, which join `given`. The one place call ids are minted."""
    while len(given) < count:
        given.append(proto.mint_call_id())
    return given[:count]


# A harness hears this often from a stream, at least, while the engine queues, prefills or
# stalls: proxies and harness idle timeouts are 60 s and more (Codex's stream idle timeout is
# 300 s), and an Anthropic stream pings about this often.
KEEPALIVE_S = 15.0


class LiveStream:
    """One reply streamed while it is sampled: `open` once, then `delta` with what
    `text.stream_parsing` hands out (reasoning, content, calls), `keepalive` when nothing else
    went out for a while, and `close` with the finished reply (the body `WireProtocol.reply`
    built from `call_ids` and `item_ids`, the ids this stream sent) and what the parser held.

    This base one sends nothing as sampled: SSE comments while the turn runs, then the whole
    reply as `WireProtocol.stream` writes it. A protocol that can do better overrides it."""

    def __init__(self, proto: WireProtocol, body: Mapping[str, Any]) -> None:
        self.proto = proto
        self.body = body
        self.call_ids: list[str] = []
        self.item_ids: dict[str, str] = {}

    def call_id(self, index: int) -> str:
        """The id of the reply's call `index`."""
        return fill_call_ids(self.proto, self.call_ids, index + 1)[index]

    def open(self) -> bytes:
        return b""

    def delta(self, out: StreamDeltas) -> bytes:
        return b""

    def keepalive(self) -> bytes:
        # An SSE comment: every client ignores it; it only keeps the connection busy.
        return b": keepalive\n\n"

    def close(self, reply: dict[str, Any], rest: StreamDeltas) -> bytes:
        return b"".join(self.proto.stream(reply, self.body))

    def error(self, status: int, kind: str, message: str) -> bytes:
        """An error after the 200 went out, in the protocol's error shape."""
        body = json.dumps(self.proto.error_body(status, kind, message), ensure_ascii=False)
        return f"data: {body}\n\n".encode()


W = TypeVar("W", bound="WireProtocol")


class WireProtocol(ABC):
    """One wire protocol: its routes, translation, sampling keys, replies, SSE and errors."""

    name: ClassVar[str]
    # The route that runs a turn, and the one that counts a request's tokens (if any).
    turn_path: ClassVar[str]
    count_tokens_path: ClassVar[str | None] = None
    # Paths whose errors are written in this protocol's shape.
    path_prefixes: ClassVar[tuple[str, ...]]
    # The top-level fields of a turn's body and of a count's, with their types
    # (`protocols.fields`); None: unchecked.
    fields: ClassVar[Spec | None] = None
    count_fields: ClassVar[Spec | None] = None
    # How this instance reads and writes the wire (`configured`).
    options: WireOptions = DEFAULT_WIRE

    def configured(self: W, options: WireOptions) -> W:
        """This protocol reading and writing the wire with `options` (a copy: the registered
        instance keeps tokentrail's)."""
        clone = copy.copy(self)
        clone.options = options
        return clone

    def check_fields(
        self,
        body: Mapping[str, Any],
        *,
        counting: bool = False,
        defaults: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """Refuse a known field of the wrong type (or a required one missing) with a 400
        naming it, before anything of the body is translated. `defaults`: the sampling
        defaults of the session (a trainer's), which fill what a request leaves out.
        Returns the fields whose values were accepted unknown (`fields.Hint`), to be counted."""
        spec = self.count_fields if counting else self.fields
        return [] if spec is None else spec.validate(body)

    def session_id(
        self, headers: Mapping[str, str], body: Mapping[str, Any], *, trust_body: bool = False
    ) -> str:
        """The session a request belongs to: the credential it carries (the API key).

        A protocol may also name the session in the body, read only when `trust_body` (the
        operator's `--session-from-body`): otherwise any client could write into any session.
        """
        token, key = bearer(headers), headers.get("x-api-key")
        if token and key and token != key:
            raise RequestError(
                "Authorization and x-api-key name different sessions: send the session id as "
                "one of them (or the same in both)"
            )
        sid = token or key
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

    def wants_logprobs(self, body: Mapping[str, Any]) -> bool:
        """Whether the reply carries each sampled token's logprob."""
        return False

    def stream_requested(self, body: Mapping[str, Any]) -> bool:
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("stream must be a boolean")
        return stream

    @abstractmethod
    def mint_call_id(self) -> str:
        """A fresh id for one tool call of a reply."""

    def mint_reply_id(self) -> str:
        """A fresh id for a reply; the session's turn keeps it (see `continues`)."""
        return mint_id("reply_")

    def continues(self, body: Mapping[str, Any]) -> str | None:
        """The id of an earlier reply this request continues (its history is not resent)."""
        return None

    def translate_after(
        self, body: dict[str, Any], prior: list[Message], prior_calls: list[str]
    ) -> Conversation:
        """`translate` for a request that continues `prior` (the earlier turn's messages and
        its reply), whose tool calls had the ids `prior_calls`."""
        raise RequestError(f"{self.name} requests cannot continue an earlier reply")

    @abstractmethod
    def reply(self, outcome: Outcome) -> dict[str, Any]:
        """The JSON body of a non-streamed reply."""

    @abstractmethod
    def stream(self, reply: dict[str, Any], body: Mapping[str, Any]) -> Iterator[bytes]:
        """The SSE frames of a streamed reply, from the same body `reply` built."""

    @abstractmethod
    def error_body(self, status: int, kind: str, message: str) -> dict[str, Any]:
        """The protocol's JSON error shape."""

    def live(
        self, body: Mapping[str, Any], reply_id: str, model: str, prompt_tokens: int
    ) -> LiveStream:
        """A stream of the reply `reply_id` as it is sampled (see `LiveStream`)."""
        return LiveStream(self, body)

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


@dataclass
class ContentReader:
    """Reads one request's content parts into text, counting what it cannot keep.

    Text parts give their text; media parts (images, documents, audio: `media_types` maps a
    part type to its kind) become `IMAGE_PLACEHOLDER`, and each one is counted in `media`, so
    a trainer sees how much of a prompt the model never saw. An image part becomes an image
    mark instead and its source is kept in `images` by digest: `text.vision.resolve_images`
    turns the mark into vision tokens for a family that takes images, and into
    `IMAGE_PLACEHOLDER` for the rest. Any other part is refused.
    """

    text_types: Collection[str]
    media_types: Mapping[str, str]
    media: Counter[str] = field(default_factory=Counter)
    images: dict[str, ImageSource] = field(default_factory=dict)

    def text(self, content: object, where: str, *, allow_null: bool = False) -> str:
        """Text of a string or of a list of content parts, the parts joined by newlines."""
        if content is None and allow_null:
            return ""
        if isinstance(content, str):
            return content
        if not isinstance(content, list):
            expected = "a string, null or a list" if allow_null else "a string or a list"
            raise RequestError(f"{where} must be {expected} of content blocks")
        return "\n".join(self.part(block, f"{where}[{pos}]") for pos, block in enumerate(content))

    def part(self, block: object, where: str) -> str:
        """The text of one content part."""
        if not isinstance(block, dict):
            raise RequestError(f"{where} must be a content block object")
        kind = block.get("type")
        if kind in self.text_types:
            if not isinstance(block.get("text"), str):
                raise RequestError(f"{where}.text must be a string")
            return str(block["text"])
        if isinstance(kind, str) and kind in self.media_types:
            self.media[self.media_types[kind]] += 1
            if self.media_types[kind] != "image":
                return IMAGE_PLACEHOLDER
            source = image_source(block)
            self.images[source.digest] = source
            return image_mark(source.digest)
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


@dataclass
class DeclaredTools:
    """A request's tools: the functions offered to the model, and the typed tools withheld.

    A typed tool the harness does not execute itself (Anthropic's server tools such as
    `web_search_20250305` or `code_execution_*`, OpenAI's non-function tools) would render as
    a parameterless function whose calls nobody runs; it is withheld from the prompt and named
    in `withheld` (its `type`), which the turn's sample metadata lists.
    """

    tools: list[ToolSchema] | None
    withheld: list[str] = field(default_factory=list)


def translate_tools(
    tools: object, read: Callable[[int, Any], ToolSchema | str], *, unique: bool = False
) -> DeclaredTools:
    """A request's tool list through the protocol's `read(pos, tool)`, which returns a tool
    or the type of a tool to withhold; tools None when absent. With `unique`, two functions of
    one name are a 400 (the Messages API refuses them: a call could not say which it meant)."""
    if tools is None:
        return DeclaredTools(None)
    if not isinstance(tools, list):
        raise RequestError("tools must be a list")
    out = DeclaredTools([])
    seen: dict[str, int] = {}
    for pos, tool in enumerate(tools):
        read_tool = read(pos, tool)
        if isinstance(read_tool, str):
            out.withheld.append(read_tool)
            continue
        name = read_tool["function"]["name"]
        if unique and seen.setdefault(name, pos) != pos:
            raise RequestError(
                f"tools[{pos}].name: {name!r} is the name of tools[{seen[name]}] too; tool "
                "names must be unique"
            )
        assert out.tools is not None
        out.tools.append(read_tool)
    return out


def tool_choice(
    mode: ToolChoice, name: object, declared: DeclaredTools, where: str = "tool_choice"
) -> tuple[ToolChoice, str | None]:
    """A request's tool choice, checked against its tools: a forced choice needs tools, and a
    named tool must be one of the offered functions."""
    if mode is not ToolChoice.REQUIRED:
        return mode, None
    names = [t["function"]["name"] for t in declared.tools or ()]
    if not names:
        raise RequestError(f"{where} forces a tool call but the request offers no tools")
    if name is None:
        return mode, None
    if not isinstance(name, str):
        raise RequestError(f"{where}: the tool name must be a string")
    if name not in names:
        withheld = " (a server tool, withheld)" if name in declared.withheld else ""
        raise RequestError(f"{where} names {name!r}, which is not a declared tool{withheld}")
    return mode, name


# Server-side and tool-search content blocks (Anthropic) that arrive in a history: the harness
# did not run them and the model cannot call them, but they are part of what the conversation
# said, so they render as text rather than being refused. Keys that carry no meaning for the
# model (ids, signatures, encrypted payloads, cache control) are left out.
SERVER_BLOCK_SUFFIXES = ("_tool_use", "_tool_result")
_OPAQUE_KEYS = frozenset(
    {"type", "id", "tool_use_id", "cache_control", "citations", "encrypted_content",
     "encrypted_index", "signature", "page_age", "file_id"}
)  # fmt: skip


def is_server_block(kind: object) -> bool:
    """A content block a server tool wrote (`server_tool_use`, `web_search_tool_result`,
    `mcp_tool_use`, ...), or a tool-search block (`tool_reference`, `search_result`)."""
    if not isinstance(kind, str) or kind in ("tool_use", "tool_result"):
        return False
    return kind.endswith(SERVER_BLOCK_SUFFIXES) or kind in ("tool_reference", "search_result")


def server_block_text(block: Mapping[str, Any]) -> str:
    """A server-tool or tool-search block as plain text, the same text every time it is sent.

    `server_tool_use` → `[web_search call: {"query": "x"}]`; a tool result → its type, then the
    titles, urls and texts it holds, one per line; `tool_reference` → `[tool reference: NAME]`.
    """
    kind = str(block.get("type"))
    if kind.endswith("_tool_use"):
        payload = json.dumps(block.get("input", {}), ensure_ascii=False, sort_keys=True)
        return f"[{block.get('name', kind)} call: {payload}]"
    if kind == "tool_reference":
        return f"[tool reference: {block.get('tool_name', '')}]"
    lines = [f"[{kind}]"]
    _flatten(block, lines)
    return "\n".join(lines)


def _flatten(value: object, lines: list[str]) -> None:
    if isinstance(value, str):
        if value:
            lines.append(value)
    elif isinstance(value, bool) or isinstance(value, int | float):
        lines.append(json.dumps(value))
    elif isinstance(value, Mapping):
        for key, sub in value.items():
            if key not in _OPAQUE_KEYS:
                _flatten(sub, lines)
    elif isinstance(value, list):
        for sub in value:
            _flatten(sub, lines)


def wire_messages(
    body: Mapping[str, Any], roles: Collection[str], start: int = 0
) -> Iterator[tuple[str, dict[str, Any], str]]:
    """The request's `messages`, checked: a non-empty list of objects with a known role.
    Yields (where, message, role) from position `start` on, `where` naming the message in
    errors."""
    raw = body.get("messages")
    if not isinstance(raw, list):
        raise RequestError("messages must be a list")
    if not raw:
        raise RequestError("messages must not be empty")
    for pos in range(start, len(raw)):
        m = raw[pos]
        where = f"messages[{pos}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object")
        role = m.get("role")
        if role not in roles:
            raise RequestError(f"{where}.role must be one of {tuple(roles)}, got {role!r}")
        yield where, m, str(role)


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
    "DEFAULT_WIRE",
    "IMAGE_PLACEHOLDER",
    "REMINDER_CLOSE",
    "REMINDER_OPEN",
    "ContentReader",
    "Conversation",
    "DeclaredTools",
    "Outcome",
    "ToolResults",
    "WireOptions",
    "WireProtocol",
    "append_system_note",
    "bearer",
    "fill_call_ids",
    "is_server_block",
    "mint_id",
    "pieces",
    "protocol_for_path",
    "protocols",
    "register_protocol",
    "sampling_keys",
    "server_block_text",
    "system_reminder",
    "tool_choice",
    "tool_schema",
    "translate_tools",
    "wire_messages",
]
