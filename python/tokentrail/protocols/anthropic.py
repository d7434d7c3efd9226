"""Anthropic Messages on the wire, chat-template messages inside.

`translate_request` turns a `/v1/messages` body into the messages and tools tokentrail renders;
`response_content` turns a parsed assistant message back into content blocks. Wire-only keys
(`cache_control`, ids, signatures) never reach the messages, so they cannot break routing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from tokentrail.errors import RequestError
from tokentrail.protocols.common import Translated, append_system_note, function_tool

IMAGE_PLACEHOLDER = "[image]"
ROLES = ("user", "assistant", "system")


def translate_tools(tools: object) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list")
    out = []
    for pos, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise RequestError(f"tools[{pos}] must be an object with a string name")
        schema = tool.get("input_schema", {"type": "object", "properties": {}})
        if not isinstance(schema, dict):
            raise RequestError(f"tools[{pos}].input_schema must be an object")
        out.append(function_tool(tool["name"], tool.get("description"), schema))
    return out


def _text_of(content: object, where: str) -> str:
    """Text of a string or of a list of blocks (text joined, images as a placeholder)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string or a list of content blocks")
    parts = []
    for pos, block in enumerate(content):
        if not isinstance(block, dict):
            raise RequestError(f"{where}[{pos}] must be a content block object")
        kind = block.get("type")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise RequestError(f"{where}[{pos}].text must be a string")
            parts.append(block["text"])
        elif kind in ("image", "document"):
            parts.append(IMAGE_PLACEHOLDER)
        else:
            raise RequestError(f"{where}[{pos}]: unsupported block type {kind!r} here")
    return "\n".join(parts)


def _system_text(system: object) -> str | None:
    if system is None:
        return None
    text = _text_of(system, "system")
    return text or None


def _user_messages(content: object, where: str, open_calls: set[str]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise RequestError(f"{where}.content must be a string or a list of content blocks")
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for pos, block in enumerate(content):
        if not isinstance(block, dict):
            raise RequestError(f"{where}.content[{pos}] must be a content block object")
        kind = block.get("type")
        if kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or call_id not in open_calls:
                raise RequestError(
                    f"{where}.content[{pos}]: tool_result for {call_id!r} has no matching "
                    "tool_use in the previous assistant message"
                )
            open_calls.discard(call_id)
            result = block.get("content", "")
            msg: dict[str, Any] = {
                "role": "tool",
                "content": _text_of(result, f"{where}.content[{pos}].content"),
            }
            if block.get("is_error") is True:
                msg["is_error"] = True
            out.append(msg)
        elif kind == "text":
            if not isinstance(block.get("text"), str):
                raise RequestError(f"{where}.content[{pos}].text must be a string")
            texts.append(block["text"])
        elif kind in ("image", "document"):
            texts.append(IMAGE_PLACEHOLDER)
        else:
            raise RequestError(f"{where}.content[{pos}]: unsupported block type {kind!r}")
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def assistant_message(content: object, where: str = "content") -> tuple[dict[str, Any], set[str]]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}, set()
    if not isinstance(content, list):
        raise RequestError(f"{where}.content must be a string or a list of content blocks")
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    ids: set[str] = set()
    for pos, block in enumerate(content):
        if not isinstance(block, dict):
            raise RequestError(f"{where}.content[{pos}] must be a content block object")
        kind = block.get("type")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise RequestError(f"{where}.content[{pos}].text must be a string")
            texts.append(block["text"])
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise RequestError(f"{where}.content[{pos}].thinking must be a string")
            thinking.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            name, args = block.get("name"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(args, dict):
                raise RequestError(
                    f"{where}.content[{pos}]: tool_use needs a string name and an object input"
                )
            if isinstance(block.get("id"), str):
                ids.add(block["id"])
            calls.append({"type": "function", "function": {"name": name, "arguments": args}})
        else:
            raise RequestError(f"{where}.content[{pos}]: unsupported block type {kind!r}")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        msg["reasoning_content"] = "\n".join(thinking)
    if calls:
        msg["tool_calls"] = calls
    return msg, ids


def translate_request(body: dict[str, Any]) -> Translated:
    """A Messages request body to chat-template messages and OpenAI-style tools.

    `system` (a string or blocks) becomes the first message. A `system` message in the middle
    of the list (Claude Code sends them) becomes user text (see `append_system_note`).
    """
    raw = body.get("messages")
    if not isinstance(raw, list):
        raise RequestError("messages must be a list")
    if not raw:
        raise RequestError("messages must not be empty")
    tools = translate_tools(body.get("tools"))
    messages: list[dict[str, Any]] = []
    system = _system_text(body.get("system"))
    if system is not None:
        messages.append({"role": "system", "content": system})
    open_calls: set[str] = set()
    for pos, m in enumerate(raw):
        where = f"messages[{pos}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object")
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role must be one of {ROLES}, got {role!r}")
        if "content" not in m:
            raise RequestError(f"{where} has no content")
        if role == "assistant":
            msg, open_calls = assistant_message(m["content"], where)
            messages.append(msg)
        elif role == "user":
            messages.extend(_user_messages(m["content"], where, open_calls))
            open_calls = set()
        else:
            append_system_note(messages, _text_of(m["content"], f"{where}.content"))
    return Translated(messages, tools)


def response_content(message: dict[str, Any], ids: list[str]) -> list[dict[str, Any]]:
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


def stop_reason(message: dict[str, Any], finish_reason: str) -> str:
    if finish_reason == "length":
        return "max_tokens"
    if message.get("tool_calls"):
        return "tool_use"
    return STOP_REASONS.get(finish_reason, "end_turn")


def message_response(
    *,
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    stop: str,
    input_tokens: int,
    output_tokens: int,
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def stream_events(response: dict[str, Any], *, chunk: int = 64) -> Iterator[bytes]:
    """The SSE frames of a finished response, as the Messages API streams them.

    Tool input goes out as `input_json_delta` pieces: clients assemble the input from those
    and ignore the (empty) `input` of `content_block_start`.
    """
    start = {**response, "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": response["usage"]["input_tokens"], "output_tokens": 0}
    yield _sse("message_start", {"type": "message_start", "message": start})
    for index, block in enumerate(response["content"]):
        kind = block["type"]
        if kind == "text":
            head, deltas = (
                {"type": "text", "text": ""},
                [{"type": "text_delta", "text": part} for part in _pieces(block["text"], chunk)],
            )
        elif kind == "thinking":
            head = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": part}
                for part in _pieces(block["thinking"], chunk)
            ]
            deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
        else:
            head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            payload = json.dumps(block["input"], ensure_ascii=False)
            deltas = [
                {"type": "input_json_delta", "partial_json": part}
                for part in _pieces(payload, chunk)
            ]
        yield _sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": head},
        )
        for delta in deltas:
            yield _sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
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


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]
