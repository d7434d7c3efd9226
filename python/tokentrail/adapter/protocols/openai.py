"""OpenAI Chat Completions (`POST /v1/chat/completions`) on the wire, chat-template messages
inside.

Tool-call arguments travel as JSON strings and live inside as dicts (a malformed string is
kept whole as `_raw_arguments`); tool-call ids are minted per response and dropped inside, so
they never decide how a turn routes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

from tokentrail.adapter.protocols.common import (
    OpenCalls,
    Outcome,
    WireProtocol,
    append_system_note,
    mint_id,
    pieces,
    register_protocol,
    sampling_keys,
    text_of,
    tool_schema,
    translate_tools,
    wire_messages,
)
from tokentrail.errors import RequestError
from tokentrail.messages import Conversation, Message, ToolCall, ToolSchema

ROLES = ("system", "developer", "user", "assistant", "tool")
TEXT = ("text",)
IMAGES = ("image_url", "input_image", "input_audio", "file")


def _tool(pos: int, tool: object) -> ToolSchema:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError(f"tools[{pos}] must be {{'type': 'function', 'function': {{...}}}}")
    return tool_schema(pos, fn["name"], fn.get("description"), fn.get("parameters"))


def _text(content: object, where: str) -> str:
    return text_of(content, where, text_types=TEXT, image_types=IMAGES, allow_null=True)


def parse_arguments(raw: object) -> dict[str, Any]:
    """Wire arguments to a dict; a string that is not a JSON object is kept as `_raw_arguments`."""
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        raise RequestError("tool call arguments must be a JSON string")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return {"_raw_arguments": raw}
    return value if isinstance(value, dict) else {"_raw_arguments": raw}


def dump_arguments(arguments: dict[str, Any]) -> str:
    if set(arguments) == {"_raw_arguments"}:
        return str(arguments["_raw_arguments"])
    return json.dumps(arguments, ensure_ascii=False)


def _assistant(m: dict[str, Any], where: str) -> tuple[Message, list[str]]:
    msg: Message = {"role": "assistant", "content": _text(m.get("content"), f"{where}.content")}
    reasoning = m.get("reasoning_content", m.get("reasoning"))
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise RequestError(f"{where}.reasoning_content must be a string")
        if reasoning:
            msg["reasoning_content"] = reasoning
    calls = m.get("tool_calls")
    ids: list[str] = []
    if calls is not None:
        if not isinstance(calls, list):
            raise RequestError(f"{where}.tool_calls must be a list")
        out: list[ToolCall] = []
        for pos, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise RequestError(f"{where}.tool_calls[{pos}] needs function.name")
            if isinstance(call.get("id"), str):
                ids.append(call["id"])
            arguments = parse_arguments(fn.get("arguments", "{}"))
            out.append(
                {"type": "function", "function": {"name": fn["name"], "arguments": arguments}}
            )
        if out:
            msg["tool_calls"] = out
    return msg, ids


def translate_request(body: Mapping[str, Any]) -> Conversation:
    tools = translate_tools(body.get("tools"), _tool)
    messages: list[Message] = []
    calls = OpenCalls()
    for where, m, role in wire_messages(body, ROLES):
        if role == "assistant":
            msg, ids = _assistant(m, where)
            calls.open(ids)
            messages.append(msg)
            continue
        if "content" not in m:
            raise RequestError(f"{where} has no content")
        text = _text(m["content"], f"{where}.content")
        if role == "tool":
            calls.answer(m.get("tool_call_id"), where, "tool message")
            messages.append({"role": "tool", "content": text})
        elif role in ("system", "developer"):
            if messages:
                append_system_note(messages, text)
            else:
                messages.append({"role": "system", "content": text})
        else:
            messages.append({"role": "user", "content": text})
            calls.close_all()
    return Conversation(messages, tools)


def finish_reason(message: Message, finish: str) -> str:
    if finish == "length":
        return "length"
    return "tool_calls" if message.get("tool_calls") else "stop"


def wire_message(message: Message, ids: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or None}
    if message.get("reasoning_content"):
        out["reasoning_content"] = message["reasoning_content"]
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": dump_arguments(call["function"]["arguments"]),
                },
            }
            for call, call_id in zip(calls, ids, strict=True)
        ]
    return out


def stream_chunks(response: dict[str, Any], *, include_usage: bool) -> Iterator[bytes]:
    """The `data:` frames of a finished completion, ending with `data: [DONE]`."""
    head = {k: response[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    choice = response["choices"][0]
    message = choice["message"]

    def frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
        body = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    yield frame({"role": "assistant", "content": ""})
    for part in pieces(message.get("reasoning_content") or ""):
        yield frame({"reasoning_content": part})
    for part in pieces(message.get("content") or ""):
        yield frame({"content": part})
    for index, call in enumerate(message.get("tool_calls") or ()):
        fn = call["function"]
        yield frame(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": fn["name"], "arguments": ""},
                    }
                ]
            }
        )
        for part in pieces(fn["arguments"]):
            yield frame({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
    yield frame({}, choice["finish_reason"])
    if include_usage:
        usage = {**head, "choices": [], "usage": response["usage"]}
        yield f"data: {json.dumps(usage)}\n\n".encode()
    yield b"data: [DONE]\n\n"


@register_protocol
class OpenAIChat(WireProtocol):
    name = "openai"
    turn_path = "/v1/chat/completions"
    path_prefixes = ("/v1/chat", "/v1")

    def session_id(
        self, headers: Mapping[str, str], body: Mapping[str, Any], *, trust_body: bool = False
    ) -> str:
        # Older harnesses name the session in the body (`metadata.session_id`, `user`); only
        # an operator who trusts every client lets that override the bearer.
        if trust_body:
            metadata = body.get("metadata")
            sid = metadata.get("session_id") if isinstance(metadata, dict) else None
            sid = sid or (body.get("user") if isinstance(body.get("user"), str) else None)
            if isinstance(sid, str) and sid:
                return sid
        return super().session_id(headers, body)

    def translate(self, body: dict[str, Any]) -> Conversation:
        return translate_request(body)

    def sampling(self, body: Mapping[str, Any]) -> dict[str, Any]:
        key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        return sampling_keys(body, key, "stop")

    def mint_call_id(self) -> str:
        return mint_id("call_")

    def reply(self, outcome: Outcome) -> dict[str, Any]:
        message = outcome.message
        return {
            "id": mint_id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": outcome.model,
            "choices": [
                {
                    "index": 0,
                    "message": wire_message(message, outcome.call_ids),
                    "finish_reason": finish_reason(message, outcome.finish_reason),
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": outcome.prompt_tokens,
                "completion_tokens": outcome.output_tokens,
                "total_tokens": outcome.prompt_tokens + outcome.output_tokens,
            },
        }

    def stream(self, reply: dict[str, Any], body: Mapping[str, Any]) -> Iterator[bytes]:
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        return stream_chunks(reply, include_usage=include_usage)

    def error_body(self, status: int, kind: str, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "code": status}}
