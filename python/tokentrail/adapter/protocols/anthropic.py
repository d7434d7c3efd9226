"""Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`) on the wire,
chat-template messages inside.

`translate_request` turns a body into the messages and tools tokentrail renders;
`response_content` turns a parsed assistant message back into content blocks. Wire-only keys
(`cache_control`, ids, signatures) never reach the messages, so they cannot break routing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import partial
from itertools import chain
from typing import Any

from tokentrail.adapter.protocols.base import LiveStream, WireProtocol
from tokentrail.adapter.protocols.content import ContentReader, append_system_note, wire_messages
from tokentrail.adapter.protocols.fields import ANTHROPIC, ANTHROPIC_COUNT, ANTHROPIC_DEFAULTED
from tokentrail.adapter.protocols.ids import mint_id
from tokentrail.adapter.protocols.options import DEFAULT_WIRE, WireOptions, system_reminder
from tokentrail.adapter.protocols.outcome import Outcome
from tokentrail.adapter.protocols.registry import register_protocol
from tokentrail.adapter.protocols.resume import Fold, ResumableProtocol, Translated
from tokentrail.adapter.protocols.sampling import sampling_keys
from tokentrail.adapter.protocols.server_blocks import is_server_block, server_block_text
from tokentrail.adapter.protocols.sse import pieces, text_frames
from tokentrail.adapter.protocols.tool_results import ToolResults
from tokentrail.adapter.protocols.tools import (
    DeclaredTools,
    tool_choice,
    tool_schema,
    translate_tools,
)
from tokentrail.errors import RequestError
from tokentrail.kinds import ToolChoice
from tokentrail.messages import Conversation, Message, ToolCall, ToolSchema
from tokentrail.text.stream_parsing import StreamDeltas

ROLES = ("user", "assistant", "system")
TEXT = ("text",)
MEDIA = {"image": "image", "document": "document"}
# What `tool_choice.type` means, in tokentrail's vocabulary.
TOOL_CHOICES = {
    "auto": ToolChoice.AUTO,
    "none": ToolChoice.NONE,
    "any": ToolChoice.REQUIRED,
    "tool": ToolChoice.REQUIRED,
}


def _tool(pos: int, tool: object) -> ToolSchema | str:
    if not isinstance(tool, dict):
        raise RequestError(f"tools[{pos}] must be an object with a string name")
    kind = tool.get("type")
    if kind not in (None, "custom") and "input_schema" not in tool:
        # A server tool (web_search_20250305, code_execution_*, ...): the API runs it, the
        # harness does not; withheld (see `DeclaredTools`).
        if not isinstance(kind, str):
            raise RequestError(f"tools[{pos}].type must be a string")
        return kind
    return tool_schema(pos, tool.get("name"), tool.get("description"), tool.get("input_schema"))


def _reader() -> ContentReader:
    return ContentReader(TEXT, MEDIA)


def _result_text(content: object, where: str, reader: ContentReader) -> str:
    """A tool result's content: text, media, and the tool-search blocks it may hold
    (`tool_reference`, `search_result`) as text."""
    if not isinstance(content, list):
        return reader.text(content, where)
    parts = []
    for pos, block in enumerate(content):
        at = f"{where}[{pos}]"
        if isinstance(block, dict) and is_server_block(block.get("type")):
            parts.append(server_block_text(block))
        else:
            parts.append(reader.part(block, at))
    return "\n".join(parts)


def _user_messages(
    content: object, where: str, results: ToolResults, reader: ContentReader
) -> list[Message]:
    if isinstance(content, str):
        if not content:
            raise RequestError(f"{where}.content must not be empty")
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise RequestError(f"{where}.content must be a string or a list of content blocks")
    if not content:
        raise RequestError(f"{where}.content must not be empty")
    texts: list[str] = []
    for pos, block in enumerate(content):
        at = f"{where}.content[{pos}]"
        if not isinstance(block, dict):
            raise RequestError(f"{at} must be a content block object")
        kind = block.get("type")
        if kind == "tool_result":
            msg: Message = {
                "role": "tool",
                "content": _result_text(block.get("content", ""), f"{at}.content", reader),
            }
            if block.get("is_error") is True:
                msg["is_error"] = True
            results.answer(block.get("tool_use_id"), msg, at, "tool_result")
        elif is_server_block(kind):
            texts.append(server_block_text(block))
        else:
            texts.append(reader.part(block, at))
    out = results.flush()
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def assistant_message(content: object, where: str = "content") -> tuple[Message, list[str | None]]:
    """An assistant message from its content blocks, and the ids of its tool calls (None for
    a call without one).

    Server-tool blocks in it (`server_tool_use`, `web_search_tool_result`, ...) become text
    paragraphs of the message.
    """
    if isinstance(content, str):
        return {"role": "assistant", "content": content}, []
    if not isinstance(content, list):
        raise RequestError(f"{where}.content must be a string or a list of content blocks")
    # Paragraphs of text: adjacent text blocks join as they are (a reply split around
    # citations), a server-tool block is a paragraph of its own.
    paragraphs: list[str] = []
    text_open = False
    thinking: list[str] = []
    calls: list[ToolCall] = []
    ids: list[str | None] = []
    for pos, block in enumerate(content):
        at = f"{where}.content[{pos}]"
        if not isinstance(block, dict):
            raise RequestError(f"{at} must be a content block object")
        kind = block.get("type")
        if kind == "text":
            text = ContentReader(TEXT, {}).part(block, at)
            if text_open:
                paragraphs[-1] += text
            else:
                paragraphs.append(text)
            text_open = True
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise RequestError(f"{at}.thinking must be a string")
            thinking.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            name, args = block.get("name"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(args, dict):
                raise RequestError(f"{at}: tool_use needs a string name and an object input")
            ids.append(block["id"] if isinstance(block.get("id"), str) else None)
            calls.append({"type": "function", "function": {"name": name, "arguments": args}})
        elif is_server_block(kind):
            paragraphs.append(server_block_text(block))
            text_open = False
        else:
            raise RequestError(f"{at}: unsupported block type {kind!r}")
    msg: Message = {"role": "assistant", "content": "\n\n".join(p for p in paragraphs if p)}
    if thinking:
        msg["reasoning_content"] = "\n".join(thinking)
    if calls:
        msg["tool_calls"] = calls
    return msg, ids


def _tool_choice(body: Mapping[str, Any], declared: DeclaredTools) -> tuple[ToolChoice, str | None]:
    choice = body.get("tool_choice")
    if choice is None:
        return ToolChoice.AUTO, None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in TOOL_CHOICES:
        raise RequestError(
            f"tool_choice must be an object with type one of {tuple(TOOL_CHOICES)}, got {choice!r}"
        )
    name = choice.get("name") if kind == "tool" else None
    if kind == "tool" and name is None:
        raise RequestError("tool_choice of type 'tool' needs a name")
    return tool_choice(TOOL_CHOICES[kind], name, declared)


def translate_request(body: Mapping[str, Any], options: WireOptions = DEFAULT_WIRE) -> Conversation:
    """A Messages request body to chat-template messages and OpenAI-style tools.

    `system` (a string or blocks) becomes the first message. A `system` message in the middle
    of the list (Claude Code sends them) becomes user text (see `append_system_note`; slime's
    `<system-reminder>` message with `options.system_reminder`). Tool results are put in the
    order of their calls (see `ToolResults`).
    """
    return translate_from(body, None, 0, options).conversation


def declared_tools(body: Mapping[str, Any]) -> list[ToolSchema] | None:
    """The request's tool declarations as the chat template's tools (None: none declared)."""
    return _declared(body).tools


def _declared(body: Mapping[str, Any]) -> Conversation:
    """The request's tools and tool choice (no messages yet)."""
    declared = translate_tools(body.get("tools"), _tool, unique=True)
    choice, forced = _tool_choice(body, declared)
    return Conversation([], declared.tools, choice, forced, declared.withheld)


def translate_from(
    body: Mapping[str, Any],
    previous: Translated | None,
    at: int,
    options: WireOptions = DEFAULT_WIRE,
) -> Translated:
    """`translate_request`, resuming `previous` before wire message `at` when it can (see
    `tokentrail.adapter.protocols.resume`)."""
    fold = Fold(_reader(), results=ToolResults(by_position=options.results_by_position))
    tools, at = fold.start(previous, at, partial(_declared, body))
    if at == 0 and body.get("system") is not None:
        # Text blocks only, as the API takes them: a system prompt is not where media go.
        system = ContentReader(TEXT, {}).text(body["system"], "system")
        if system:
            fold.messages.append({"role": "system", "content": system})
    messages, results, reader = fold.messages, fold.results, fold.reader
    for where, m, role in wire_messages(body, ROLES, at):
        if "content" not in m:
            raise RequestError(f"{where} has no content")
        if role == "assistant":
            msg, ids = assistant_message(m["content"], where)
            results.open(ids)
            messages.append(msg)
            fold.note_calls(ids)
        elif role == "user":
            messages.extend(_user_messages(m["content"], where, results, reader))
            results.close_all()
        else:
            note = reader.text(m["content"], f"{where}.content")
            if options.system_reminder:
                messages.append({"role": "user", "content": system_reminder(note)})
            else:
                append_system_note(messages, note)
        fold.mark()
    return fold.translated(tools)


def response_content(message: Message, ids: list[str]) -> list[dict[str, Any]]:
    """Content blocks for an assistant message; `ids` names its tool calls in order."""
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append(
            {"type": "thinking", "thinking": message["reasoning_content"], "signature": ""}
        )
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call, call_id in zip(message.get("tool_calls") or (), ids, strict=True):
        fn = call["function"]
        blocks.append(
            {"type": "tool_use", "id": call_id, "name": fn["name"], "input": fn["arguments"]}
        )
    return blocks


STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "abort": "end_turn"}


def stop_reason(message: Message, finish_reason: str) -> str:
    if finish_reason == "length":
        return "max_tokens"
    if message.get("tool_calls"):
        return "tool_use"
    return STOP_REASONS.get(finish_reason, "end_turn")


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _delta(index: int, delta: dict[str, Any]) -> bytes:
    return _sse(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
    )


def _deltas(index: int, kind: str, field: str, text: str, empty: bool = True) -> Iterator[bytes]:
    """The `content_block_delta` frames of `text` in pieces (one empty piece for empty text,
    unless not `empty`)."""
    texts = pieces(text) or ([""] if empty else [])
    return text_frames(lambda piece: _delta(index, {"type": kind, field: piece}), texts)


def stream_events(response: dict[str, Any]) -> Iterator[bytes]:
    """The SSE frames of a finished response, as the Messages API streams them.

    Tool input goes out as `input_json_delta` pieces: clients assemble the input from those
    and ignore the (empty) `input` of `content_block_start`.
    """
    start = {**response, "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": response["usage"]["input_tokens"], "output_tokens": 0}
    yield _sse("message_start", {"type": "message_start", "message": start})
    for index, block in enumerate(response["content"]):
        kind = block["type"]
        head: dict[str, Any]
        # Written by `text_frames`: a long reply is thousands of deltas, each frame made
        # around its text, with no dict per delta.
        deltas: Iterator[bytes]
        if kind == "text":
            head = {"type": "text", "text": ""}
            deltas = _deltas(index, "text_delta", "text", block["text"])
        elif kind == "thinking":
            head = {"type": "thinking", "thinking": "", "signature": ""}
            signature = {"type": "signature_delta", "signature": block.get("signature", "")}
            deltas = chain(
                _deltas(index, "thinking_delta", "thinking", block["thinking"]),
                [_delta(index, signature)],
            )
        else:
            head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            payload = json.dumps(block["input"], ensure_ascii=False)
            deltas = _deltas(index, "input_json_delta", "partial_json", payload, empty=False)
        yield _sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": head},
        )
        yield from deltas
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
    yield _sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": response["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": response["usage"]["output_tokens"]},
        },
    )
    yield _sse("message_stop", {"type": "message_stop"})


class AnthropicLive(LiveStream):
    """A Messages stream as sampled: `message_start`, a `thinking` block of `thinking_delta`s,
    a `text` block of `text_delta`s, a `tool_use` block per call with its `input_json_delta`s
    as `text.stream_calls` reads the call (as sampled, or whole once it ends), then
    `message_delta` and `message_stop`; `ping` events keep it alive."""

    def __init__(
        self, proto: WireProtocol, body: Mapping[str, Any], reply_id: str, model: str, prompt: int
    ) -> None:
        super().__init__(proto, body)
        self.head: dict[str, Any] = {
            "id": reply_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": 0},
        }
        self.index = -1
        self.block: str | None = None

    def open(self) -> bytes:
        return _sse("message_start", {"type": "message_start", "message": self.head})

    def keepalive(self) -> bytes:
        return _sse("ping", {"type": "ping"})

    def _start(self, kind: str, head: dict[str, Any]) -> bytes:
        frames = self._stop()
        self.index += 1
        self.block = kind
        return frames + _sse(
            "content_block_start",
            {"type": "content_block_start", "index": self.index, "content_block": head},
        )

    def _stop(self) -> bytes:
        if self.block is None:
            return b""
        frames = b""
        if self.block == "thinking":
            frames = self._delta({"type": "signature_delta", "signature": ""})
        self.block = None
        return frames + _sse(
            "content_block_stop", {"type": "content_block_stop", "index": self.index}
        )

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": self.index, "delta": delta},
        )

    def delta(self, out: StreamDeltas) -> bytes:
        frames = b""
        if out.reasoning:
            if self.block != "thinking":
                thinking = {"type": "thinking", "thinking": "", "signature": ""}
                frames += self._start("thinking", thinking)
            frames += self._delta({"type": "thinking_delta", "thinking": out.reasoning})
        if out.content:
            if self.block != "text":
                frames += self._start("text", {"type": "text", "text": ""})
            frames += self._delta({"type": "text_delta", "text": out.content})
        for call in out.calls:
            if call.name:
                # Clients assemble the input from the deltas; the start's `input` is empty.
                head: dict[str, Any] = {
                    "type": "tool_use",
                    "id": self.call_id(call.index),
                    "name": call.name,
                    "input": {},
                }
                frames += self._start(f"tool_use:{call.index}", head)
            if call.arguments and self.block == f"tool_use:{call.index}":
                frames += self._delta({"type": "input_json_delta", "partial_json": call.arguments})
        return frames

    def close(self, reply: dict[str, Any], rest: StreamDeltas) -> bytes:
        frames = self.delta(rest) + self._stop()
        frames += _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reply["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": reply["usage"]["output_tokens"]},
            },
        )
        return frames + _sse("message_stop", {"type": "message_stop"})

    def error(self, status: int, kind: str, message: str) -> bytes:
        return _sse("error", self.proto.error_body(status, kind, message))


@register_protocol
class AnthropicMessages(ResumableProtocol):
    name = "anthropic"
    turn_path = "/v1/messages"
    count_tokens_path = "/v1/messages/count_tokens"
    path_prefixes = ("/v1/messages",)
    context_fields = frozenset({"system", "tools", "tool_choice"})
    fields = ANTHROPIC
    count_fields = ANTHROPIC_COUNT

    def check_fields(
        self,
        body: Mapping[str, Any],
        *,
        counting: bool = False,
        defaults: Mapping[str, Any] | None = None,
    ) -> list[str]:
        # max_tokens is required, unless a trainer opened the session with its own limit.
        if not counting and "max_new_tokens" in (defaults or {}):
            noted = ANTHROPIC_DEFAULTED.validate(body)
        else:
            noted = super().check_fields(body, counting=counting)
        thinking, max_tokens = body.get("thinking"), body.get("max_tokens")
        enabled = isinstance(thinking, dict) and thinking.get("type") == "enabled"
        if not counting and enabled and isinstance(max_tokens, int):
            assert isinstance(thinking, dict)
            if thinking["budget_tokens"] >= max_tokens:
                raise RequestError(
                    f"thinking.budget_tokens: must be less than max_tokens ({max_tokens}), got "
                    f"{thinking['budget_tokens']}"
                )
        return noted

    def translate_from(
        self, body: dict[str, Any], previous: Translated | None, first_changed: int
    ) -> Translated:
        return translate_from(body, previous, first_changed, self.options)

    def sampling(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return sampling_keys(body, "max_tokens", "stop_sequences")

    def mint_call_id(self) -> str:
        return mint_id("toolu_")

    def mint_reply_id(self) -> str:
        return mint_id("msg_")

    def reply(self, outcome: Outcome) -> dict[str, Any]:
        return {
            "id": outcome.reply_id or self.mint_reply_id(),
            "type": "message",
            "role": "assistant",
            "model": outcome.model,
            "content": response_content(outcome.message, outcome.call_ids),
            "stop_reason": stop_reason(outcome.message, outcome.finish_reason),
            "stop_sequence": None,
            "usage": {
                "input_tokens": outcome.prompt_tokens,
                "output_tokens": outcome.output_tokens,
            },
        }

    def stream(self, reply: dict[str, Any], body: Mapping[str, Any]) -> Iterator[bytes]:
        return stream_events(reply)

    def error_body(self, status: int, kind: str, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": kind, "message": message}}

    def live(
        self, body: Mapping[str, Any], reply_id: str, model: str, prompt_tokens: int
    ) -> LiveStream:
        return AnthropicLive(self, body, reply_id, model, prompt_tokens)
