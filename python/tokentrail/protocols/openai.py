"""OpenAI Chat Completions on the wire, chat-template messages inside.

Tool-call arguments travel as JSON strings and live inside as dicts (a malformed string is
kept whole as `_raw_arguments`); tool-call ids are minted per response and dropped inside, so
they never decide how a turn routes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from tokentrail.errors import RequestError
from tokentrail.protocols.common import Translated, append_system_note, function_tool

IMAGE_PLACEHOLDER = "[image]"
ROLES = ("system", "developer", "user", "assistant", "tool")


def translate_tools(tools: object) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list")
    out = []
    for pos, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"tools[{pos}] must be {{'type': 'function', 'function': {{...}}}}")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise RequestError(f"tools[{pos}].function.parameters must be an object")
        out.append(function_tool(fn["name"], fn.get("description"), params))
    return out


def _text_of(content: object, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string, null or a list of content parts")
    parts = []
    for pos, part in enumerate(content):
        if not isinstance(part, dict):
            raise RequestError(f"{where}[{pos}] must be a content part object")
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise RequestError(f"{where}[{pos}].text must be a string")
            parts.append(part["text"])
        elif kind in ("image_url", "input_image", "input_audio", "file"):
            parts.append(IMAGE_PLACEHOLDER)
        else:
            raise RequestError(f"{where}[{pos}]: unsupported content part type {kind!r}")
    return "\n".join(parts)


def parse_arguments(raw: object) -> dict[str, Any]:
    """Wire arguments to a dict; a string that is not a JSON object is kept as `_raw_arguments`."""
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        raise RequestError("tool call arguments must be a JSON string")
    try:
        value = json.loads(raw)
    except ValueError:
        return {"_raw_arguments": raw}
    return value if isinstance(value, dict) else {"_raw_arguments": raw}


def dump_arguments(arguments: dict[str, Any]) -> str:
    if set(arguments) == {"_raw_arguments"}:
        return str(arguments["_raw_arguments"])
    return json.dumps(arguments, ensure_ascii=False)


def _assistant(m: dict[str, Any], where: str) -> tuple[dict[str, Any], set[str]]:
    msg: dict[str, Any] = {"role": "assistant", "content": _text_of(m.get("content"), where)}
    reasoning = m.get("reasoning_content", m.get("reasoning"))
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise RequestError(f"{where}.reasoning_content must be a string")
        if reasoning:
            msg["reasoning_content"] = reasoning
    calls = m.get("tool_calls")
    ids: set[str] = set()
    if calls is not None:
        if not isinstance(calls, list):
            raise RequestError(f"{where}.tool_calls must be a list")
        out = []
        for pos, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise RequestError(f"{where}.tool_calls[{pos}] needs function.name")
            if isinstance(call.get("id"), str):
                ids.add(call["id"])
            out.append(
                {
                    "type": "function",
                    "function": {
                        "name": fn["name"],
                        "arguments": parse_arguments(fn.get("arguments", "{}")),
                    },
                }
            )
        if out:
            msg["tool_calls"] = out
    return msg, ids


def translate_request(body: dict[str, Any]) -> Translated:
    raw = body.get("messages")
    if not isinstance(raw, list):
        raise RequestError("messages must be a list")
    if not raw:
        raise RequestError("messages must not be empty")
    tools = translate_tools(body.get("tools"))
    messages: list[dict[str, Any]] = []
    open_calls: set[str] = set()
    for pos, m in enumerate(raw):
        where = f"messages[{pos}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object")
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role must be one of {ROLES}, got {role!r}")
        if role == "assistant":
            msg, open_calls = _assistant(m, f"{where}.content")
            messages.append(msg)
            continue
        if "content" not in m:
            raise RequestError(f"{where} has no content")
        text = _text_of(m["content"], f"{where}.content")
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in open_calls:
                raise RequestError(
                    f"{where}: tool message for {call_id!r} has no matching tool call in the "
                    "previous assistant message"
                )
            open_calls.discard(call_id)
            messages.append({"role": "tool", "content": text})
        elif role in ("system", "developer"):
            if messages:
                append_system_note(messages, text)
            else:
                messages.append({"role": "system", "content": text})
        else:
            messages.append({"role": "user", "content": text})
            open_calls = set()
    return Translated(messages, tools)


def finish_reason(message: dict[str, Any], finish: str) -> str:
    if finish == "length":
        return "length"
    return "tool_calls" if message.get("tool_calls") else "stop"


def wire_message(message: dict[str, Any], ids: list[str]) -> dict[str, Any]:
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


def completion_response(
    *,
    response_id: str,
    created: int,
    model: str,
    message: dict[str, Any],
    ids: list[str],
    finish: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": wire_message(message, ids),
                "finish_reason": finish_reason(message, finish),
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def stream_chunks(
    response: dict[str, Any], *, include_usage: bool, chunk: int = 64
) -> Iterator[bytes]:
    """The `data:` frames of a finished completion, ending with `data: [DONE]`."""
    head = {k: response[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    choice = response["choices"][0]
    message = choice["message"]

    def frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
        body = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    yield frame({"role": "assistant", "content": ""})
    for part in _pieces(message.get("reasoning_content") or "", chunk):
        yield frame({"reasoning_content": part})
    for part in _pieces(message.get("content") or "", chunk):
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
        for part in _pieces(fn["arguments"], chunk):
            yield frame({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
    yield frame({}, choice["finish_reason"])
    if include_usage:
        usage = {**head, "choices": [], "usage": response["usage"]}
        yield f"data: {json.dumps(usage)}\n\n".encode()
    yield b"data: [DONE]\n\n"


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]
