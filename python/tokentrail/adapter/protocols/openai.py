"""OpenAI Chat Completions (`POST /v1/chat/completions`) on the wire, chat-template messages
inside.

Tool-call arguments travel as JSON strings and live inside as dicts (a string that is not the
JSON of an object is a 400 naming the call); tool-call ids are minted per response and dropped
inside, so they never decide how a turn routes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

from tokentrail.adapter.protocols.base import LiveStream, WireProtocol
from tokentrail.adapter.protocols.content import ContentReader, append_system_note, wire_messages
from tokentrail.adapter.protocols.fields import CHAT
from tokentrail.adapter.protocols.ids import mint_id
from tokentrail.adapter.protocols.options import DEFAULT_WIRE, WireOptions
from tokentrail.adapter.protocols.outcome import Outcome
from tokentrail.adapter.protocols.registry import register_protocol
from tokentrail.adapter.protocols.resume import Fold, ResumableProtocol, Translated
from tokentrail.adapter.protocols.sampling import sampling_keys
from tokentrail.adapter.protocols.sse import pieces
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

ROLES = ("system", "developer", "user", "assistant", "tool")
TEXT = ("text",)
MEDIA = {"image_url": "image", "input_image": "image", "input_audio": "audio", "file": "document"}
TOOL_CHOICES = {"auto": ToolChoice.AUTO, "none": ToolChoice.NONE, "required": ToolChoice.REQUIRED}
MAX_TOP_LOGPROBS = 20


def _tool(pos: int, tool: object) -> ToolSchema | str:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if isinstance(kind, str) and kind != "function":
        # A tool the harness does not run as a function (a custom grammar tool, a hosted
        # tool): withheld (see `DeclaredTools`).
        return kind
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError(f"tools[{pos}] must be {{'type': 'function', 'function': {{...}}}}")
    return tool_schema(pos, fn["name"], fn.get("description"), fn.get("parameters"))


def parse_arguments(raw: object, where: str = "arguments") -> dict[str, Any]:
    """Wire arguments (JSON text of an object, or the object) to a dict; anything else is a
    400 naming `where`, as the API answers: a call whose arguments are not an object is no
    call a template can render or a model should learn."""
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        raise RequestError(f"{where}: expected a JSON string, got {type(raw).__name__}")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise RequestError(f"{where}: nested too deep") from None
    except ValueError as exc:
        raise RequestError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise RequestError(f"{where}: expected the JSON text of an object, got {raw[:80]!r}")
    return value


def dump_arguments(arguments: dict[str, Any]) -> str:
    if set(arguments) == {"_raw_arguments"}:
        return str(arguments["_raw_arguments"])
    return json.dumps(arguments, ensure_ascii=False)


def _assistant(m: dict[str, Any], where: str, reader: ContentReader) -> tuple[Message, list[str]]:
    msg: Message = {
        "role": "assistant",
        "content": reader.text(m.get("content"), f"{where}.content", allow_null=True),
    }
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
            arguments = parse_arguments(
                fn.get("arguments", "{}"), f"{where}.tool_calls[{pos}].function.arguments"
            )
            out.append(
                {"type": "function", "function": {"name": fn["name"], "arguments": arguments}}
            )
        if out:
            msg["tool_calls"] = out
    return msg, ids


def _tool_choice(body: Mapping[str, Any], declared: DeclaredTools) -> tuple[ToolChoice, str | None]:
    choice = body.get("tool_choice")
    if choice is None:
        return ToolChoice.AUTO, None
    if isinstance(choice, str) and choice in TOOL_CHOICES:
        return tool_choice(TOOL_CHOICES[choice], None, declared)
    fn = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(fn, dict):
        return tool_choice(ToolChoice.REQUIRED, fn.get("name"), declared)
    raise RequestError(
        "tool_choice must be 'auto', 'none', 'required' or "
        f"{{'type': 'function', 'function': {{'name': ...}}}}, got {choice!r}"
    )


def translate_request(body: Mapping[str, Any]) -> Conversation:
    """A Chat Completions body to chat-template messages and tools. Tool messages are put in
    the order of the calls they answer (see `ToolResults`)."""
    return translate_from(body, None, 0).conversation


def declared_tools(body: Mapping[str, Any]) -> list[ToolSchema] | None:
    """The request's tool declarations as the chat template's tools (None: none declared)."""
    return _declared(body).tools


def _declared(body: Mapping[str, Any]) -> Conversation:
    """The request's tools and tool choice (no messages yet)."""
    declared = translate_tools(body.get("tools"), _tool)
    choice, forced = _tool_choice(body, declared)
    return Conversation([], declared.tools, choice, forced, declared.withheld)


def translate_from(body: Mapping[str, Any], previous: Translated | None, at: int) -> Translated:
    """`translate_request`, resuming `previous` before wire message `at` when it can (see
    `tokentrail.adapter.protocols.resume`)."""
    fold = Fold(ContentReader(TEXT, MEDIA))
    tools, at = fold.start(previous, at, partial(_declared, body))
    for where, m, role in wire_messages(body, ROLES, at):
        _step(fold, where, m, role)
        fold.mark()
    messages, results = fold.messages, fold.results
    messages.extend(results.flush())
    return fold.translated(tools)


def _step(fold: Fold, where: str, m: dict[str, Any], role: str) -> None:
    """One wire message into the fold's messages."""
    messages, results, reader = fold.messages, fold.results, fold.reader
    if role != "tool":
        messages.extend(results.flush())
    if role == "assistant":
        msg, ids = _assistant(m, where, reader)
        results.open(ids)
        messages.append(msg)
        fold.note_calls(ids)
        return
    if "content" not in m:
        raise RequestError(f"{where} has no content")
    text = reader.text(m["content"], f"{where}.content", allow_null=True)
    if role == "tool":
        results.answer(m.get("tool_call_id"), {"role": "tool", "content": text}, where,
                       "tool message")  # fmt: skip
    elif role in ("system", "developer"):
        if messages:
            append_system_note(messages, text)
        else:
            messages.append({"role": "system", "content": text})
    else:
        messages.append({"role": "user", "content": text})
        results.close_all()


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


def token_logprobs(outcome: Outcome) -> dict[str, Any] | None:
    """`choices[0].logprobs` for a reply that asked for them: the sampled tokens' own
    logprobs, which the engine returned anyway. Alternatives were never sampled, so every
    `top_logprobs` list is empty."""
    if outcome.token_logprobs is None:
        return None
    content = [
        {"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []}
        for text, lp in outcome.token_logprobs
    ]
    return {"content": content, "refusal": None}


def role_delta(options: WireOptions) -> dict[str, Any]:
    """The delta of a stream's first chunk (`WireOptions.bare_role_chunk`)."""
    if options.bare_role_chunk:
        return {"role": "assistant"}
    return {"role": "assistant", "content": ""}


def stream_chunks(
    response: dict[str, Any], *, include_usage: bool, options: WireOptions = DEFAULT_WIRE
) -> Iterator[bytes]:
    """The `data:` frames of a finished completion, ending with `data: [DONE]`."""
    head = {k: response[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    choice = response["choices"][0]
    message = choice["message"]

    def frame(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        if logprobs is not None:
            choice["logprobs"] = logprobs
        body = {**head, "choices": [choice]}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    yield frame(role_delta(options))
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
    if choice.get("logprobs") is not None:
        # All of them in one chunk: clients append each chunk's `logprobs.content`.
        yield frame({}, None, choice["logprobs"])
    yield frame({}, choice["finish_reason"])
    if include_usage:
        usage = {**head, "choices": [], "usage": response["usage"]}
        yield f"data: {json.dumps(usage)}\n\n".encode()
    yield b"data: [DONE]\n\n"


class ChatLive(LiveStream):
    """A Chat Completions stream as sampled: the role chunk, `reasoning_content` and `content`
    delta chunks, `tool_calls` chunks as each call is sampled (its index, id and name, then its
    `function.arguments` fragments, as `text.stream_calls` reads the call), then logprobs,
    the finish chunk, the usage chunk (`stream_options.include_usage`) and `[DONE]`; SSE
    comments keep it alive."""

    def __init__(self, proto: WireProtocol, body: Mapping[str, Any], reply_id: str, model: str):
        super().__init__(proto, body)
        self.head = {
            "id": reply_id,
            "created": int(time.time()),
            "model": model,
            "object": "chat.completion.chunk",
        }

    def _frame(self, delta: dict[str, Any]) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": None}
        payload = json.dumps({**self.head, "choices": [choice]}, ensure_ascii=False)
        return f"data: {payload}\n\n".encode()

    def open(self) -> bytes:
        return self._frame(role_delta(self.proto.options))

    def delta(self, out: StreamDeltas) -> bytes:
        frames = b""
        if out.reasoning:
            frames += self._frame({"reasoning_content": out.reasoning})
        if out.content:
            frames += self._frame({"content": out.content})
        for call in out.calls:
            if call.name:
                function = {"name": call.name, "arguments": ""}
                head = {"index": call.index, "id": self.call_id(call.index), "type": "function"}
                frames += self._frame({"tool_calls": [{**head, "function": function}]})
            if call.arguments:
                fragment = {"index": call.index, "function": {"arguments": call.arguments}}
                frames += self._frame({"tool_calls": [fragment]})
        return frames

    def close(self, reply: dict[str, Any], rest: StreamDeltas) -> bytes:
        tail = {**reply, **{k: self.head[k] for k in ("id", "created", "model")}}
        choice = reply["choices"][0]
        # What went out as sampled is left out of the closing frames.
        message = {
            **choice["message"],
            "content": None,
            "reasoning_content": None,
            "tool_calls": None,
        }
        tail["choices"] = [{**choice, "message": message}]
        frames = self.delta(rest)
        chunks = list(
            stream_chunks(tail, include_usage=_include_usage(self.body), options=self.proto.options)
        )
        return frames + b"".join(chunks[1:])  # its role chunk went out with `open`


def _include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


@register_protocol
class OpenAIChat(ResumableProtocol):
    name = "openai"
    turn_path = "/v1/chat/completions"
    path_prefixes = ("/v1/chat", "/v1")
    context_fields = frozenset({"tools", "tool_choice"})
    fields = CHAT

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

    def translate_from(
        self, body: dict[str, Any], previous: Translated | None, first_changed: int
    ) -> Translated:
        return translate_from(body, previous, first_changed)

    def sampling(self, body: Mapping[str, Any]) -> dict[str, Any]:
        n = body.get("n")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise RequestError("n must be a positive integer")
        if n is not None and n > 1:
            raise RequestError(
                f"n={n}: tokentrail samples one choice per request (each turn is one recorded "
                "sample); send n requests instead"
            )
        self.wants_logprobs(body)  # checked before anything is generated
        key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        return sampling_keys(body, key, "stop")

    def wants_logprobs(self, body: Mapping[str, Any]) -> bool:
        logprobs = body.get("logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise RequestError("logprobs must be a boolean")
        top = body.get("top_logprobs")
        if top is not None:
            if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
                raise RequestError(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]")
            if not logprobs:
                raise RequestError("top_logprobs needs logprobs: true")
        return bool(logprobs)

    def mint_call_id(self) -> str:
        return mint_id("call_")

    def mint_reply_id(self) -> str:
        return mint_id("chatcmpl-")

    def reply(self, outcome: Outcome) -> dict[str, Any]:
        message = outcome.message
        return {
            "id": outcome.reply_id or self.mint_reply_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": outcome.model,
            "choices": [
                {
                    "index": 0,
                    "message": wire_message(message, outcome.call_ids),
                    "finish_reason": finish_reason(message, outcome.finish_reason),
                    "logprobs": token_logprobs(outcome),
                }
            ],
            "usage": {
                "prompt_tokens": outcome.prompt_tokens,
                "completion_tokens": outcome.output_tokens,
                "total_tokens": outcome.prompt_tokens + outcome.output_tokens,
            },
        }

    def stream(self, reply: dict[str, Any], body: Mapping[str, Any]) -> Iterator[bytes]:
        return stream_chunks(reply, include_usage=_include_usage(body), options=self.options)

    def live(
        self, body: Mapping[str, Any], reply_id: str, model: str, prompt_tokens: int
    ) -> LiveStream:
        return ChatLive(self, body, reply_id, model)

    def error_body(self, status: int, kind: str, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "code": status}}
