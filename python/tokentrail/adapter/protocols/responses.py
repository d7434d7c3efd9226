"""OpenAI Responses (`POST /v1/responses`, `/v1/responses/input_tokens`) on the wire,
chat-template messages inside. The API the Codex CLI speaks.

Requests are read by `responses_input`. A reply's output items are its reasoning, its message
and its calls; a free-form tool's call goes back as a `custom_tool_call`. Streamed, a reply goes
out as sampled (`ResponsesLive`) or, from a recorded answer, as the events of the whole reply.

Reasoning round-trips exactly: a reply carries the raw reasoning text as `encrypted_content`
(clients with `store: false` send it back untouched) and that is what translation reads first.
Codex echoes every item it was sent dict-equal, arguments byte for byte, so a replayed turn is
recognized as the generated one without any re-rendering rule.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

from tokentrail.adapter.protocols.base import LiveStream, WireProtocol
from tokentrail.adapter.protocols.fields import RESPONSES
from tokentrail.adapter.protocols.ids import mint_id
from tokentrail.adapter.protocols.openai import dump_arguments
from tokentrail.adapter.protocols.outcome import Outcome
from tokentrail.adapter.protocols.registry import register_protocol
from tokentrail.adapter.protocols.responses_input import (
    CUSTOM_INPUT,
    ToolTable,
    read_tools,
    translate_from,
    translate_request,
)
from tokentrail.adapter.protocols.resume import ResumableProtocol, Translated
from tokentrail.adapter.protocols.sampling import sampling_keys
from tokentrail.adapter.protocols.sse import pieces
from tokentrail.errors import RequestError
from tokentrail.messages import Conversation, Message
from tokentrail.text.stream_parsing import StreamDeltas

# -- replies --------------------------------------------------------------------------------------


# The prefix of each output item kind's id.
ITEM_PREFIXES = {
    "reasoning": "rs_",
    "message": "msg_",
    "function_call": "fc_",
    "custom_tool_call": "ctc_",
}


def item_id(ids: dict[str, str], key: str, kind: str) -> str:
    """The id of a response's output item `key` (`reasoning`, `message`, `call:N`): the one
    already in `ids` (a live stream sent it), else a fresh one, kept there. The one place
    output item ids are minted."""
    if key not in ids:
        ids[key] = mint_id(ITEM_PREFIXES[kind])
    return ids[key]


def call_kind(name: str, tools: ToolTable) -> str:
    return "custom_tool_call" if name in tools.custom else "function_call"


def custom_input(arguments: dict[str, Any]) -> str:
    """A free-form tool's input: its one string parameter (else the arguments as JSON)."""
    text = arguments.get(CUSTOM_INPUT)
    return text if isinstance(text, str) else dump_arguments(arguments)


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    # The raw reasoning rides as `encrypted_content`: what a client sends back untouched.
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "encrypted_content": text,
    }


def message_item(item_id: str, text: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": item_id,
        "status": "completed",
        "role": "assistant",
        "content": [part],
    }


def output_items(outcome: Outcome, tools: ToolTable) -> list[dict[str, Any]]:
    """The `output` of a response: reasoning, the message, then each call (ids by `item_id`)."""
    message = outcome.message
    ids = outcome.item_ids
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if reasoning:
        items.append(reasoning_item(item_id(ids, "reasoning", "reasoning"), reasoning))
    if message.get("content"):
        items.append(message_item(item_id(ids, "message", "message"), message["content"]))
    calls = message.get("tool_calls") or ()
    for index, (call, call_id) in enumerate(zip(calls, outcome.call_ids, strict=True)):
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        kind = call_kind(name, tools)
        if kind == "custom_tool_call":
            items.append(
                {
                    "type": kind,
                    "id": item_id(ids, f"call:{index}", kind),
                    "status": "completed",
                    "call_id": call_id,
                    "name": name,
                    "input": custom_input(arguments),
                }
            )
            continue
        item = {
            "type": kind,
            "id": item_id(ids, f"call:{index}", kind),
            "status": "completed",
            "name": name,
            "arguments": dump_arguments(arguments),
            "call_id": call_id,
        }
        if name in tools.namespaced:
            item["namespace"], item["name"] = tools.namespaced[name]
        items.append(item)
    return items


def response_head(body: Mapping[str, Any], reply_id: str, model: str) -> dict[str, Any]:
    """The response object before any output: what `response.created` carries."""
    return {
        "id": reply_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "model": model,
        "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store", True),
        "metadata": body.get("metadata") or {},
        "usage": None,
    }


def response_object(
    outcome: Outcome, body: Mapping[str, Any], output: list[dict[str, Any]], status: str
) -> dict[str, Any]:
    length = outcome.finish_reason == "length"
    return {
        **response_head(body, outcome.reply_id, outcome.model),
        "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if length else None,
        "output": output,
        "usage": {
            "input_tokens": outcome.prompt_tokens,
            "input_tokens_details": {"cached_tokens": outcome.cached_tokens},
            "output_tokens": outcome.output_tokens,
            "output_tokens_details": {"reasoning_tokens": outcome.reasoning_tokens},
            "total_tokens": outcome.prompt_tokens + outcome.output_tokens,
        },
    }


# A run of a JSON string's body that decodes whole (no escape cut short, no closing quote).
_ESCAPED_RUN = re.compile(r'(?:[^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*')


class _Events:
    """SSE frames with a running `sequence_number`."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def stream_events(response: dict[str, Any]) -> Iterator[bytes]:
    """The SSE frames of a finished response, as the Responses API streams them."""
    event = _Events()
    head = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=head)
    yield event("response.in_progress", response=head)
    for index, item in enumerate(response["output"]):
        yield from _item_events(event, index, item)
    yield event("response.completed", response=response)


def _item_events(event: _Events, index: int, item: dict[str, Any]) -> Iterator[bytes]:
    kind, item_id = item["type"], item["id"]
    at = {"item_id": item_id, "output_index": index}
    if kind == "reasoning":
        text = item["content"][0]["text"]
        yield event("response.output_item.added", output_index=index, item={**item, "content": []})
        for part in pieces(text):
            yield event("response.reasoning_text.delta", **at, content_index=0, delta=part)
        yield event("response.reasoning_text.done", **at, content_index=0, text=text)
    elif kind == "message":
        part = item["content"][0]
        added = {**item, "status": "in_progress", "content": []}
        yield event("response.output_item.added", output_index=index, item=added)
        empty = {**part, "text": ""}
        yield event("response.content_part.added", **at, content_index=0, part=empty)
        for piece in pieces(part["text"]):
            yield event(
                "response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[]
            )
        yield event(
            "response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[]
        )
        yield event("response.content_part.done", **at, content_index=0, part=part)
    elif kind == "function_call":
        added = {**item, "status": "in_progress", "arguments": ""}
        yield event("response.output_item.added", output_index=index, item=added)
        for piece in pieces(item["arguments"]):
            yield event("response.function_call_arguments.delta", **at, delta=piece)
        yield event("response.function_call_arguments.done", **at, arguments=item["arguments"])
    else:
        added = {**item, "status": "in_progress", "input": ""}
        yield event("response.output_item.added", output_index=index, item=added)
        for piece in pieces(item["input"]):
            yield event("response.custom_tool_call_input.delta", **at, delta=piece)
        yield event("response.custom_tool_call_input.done", **at, input=item["input"])
    yield event("response.output_item.done", output_index=index, item=item)


class ResponsesLive(LiveStream):
    """A Responses stream as sampled: `response.created` and `response.in_progress` at once,
    then each output item as it is sampled (a reasoning item of `response.reasoning_text.delta`s,
    a message of `response.output_text.delta`s, a `function_call` of
    `response.function_call_arguments.delta`s, a free-form tool's `custom_tool_call` of
    `response.custom_tool_call_input.delta`s), each item's `done` events when the next begins,
    and `response.completed` with the reply. The item ids and output indexes are the reply's
    (`item_id`), the sequence numbers one run.

    The keepalive is another `response.in_progress` event, not an SSE comment: Codex's stream
    idle timeout (`stream_idle_timeout_ms`) waits for the next *event* (codex-rs `process_sse`
    wraps `eventsource().next()` in `tokio::time::timeout`, and its parser swallows comments),
    so a comment every 15 s lets a 60 s idle timeout fire through a long engine stall. Codex
    ignores an event type it does not act on."""

    def __init__(
        self, proto: WireProtocol, body: Mapping[str, Any], reply_id: str, model: str, prompt: int
    ) -> None:
        super().__init__(proto, body)
        self.tools = read_tools(body.get("tools"))
        blank: Message = {"role": "assistant", "content": ""}
        head = Outcome(model, blank, [], "stop", prompt, 0, reply_id=reply_id, body=body)
        self.head = {**response_object(head, body, [], "in_progress"), "usage": None}
        self.event = _Events()
        # The open item: its key, kind and output index, and its text (arguments or input) so
        # far; `canonical` holds a free-form call's arguments JSON, decoded into `text`.
        self.items = 0
        self.key: str | None = None
        self.kind = ""
        self.text = ""
        self.canonical = ""
        self.decoded = 0
        self.call: dict[str, Any] = {}

    def open(self) -> bytes:
        return self.event("response.created", response=self.head) + self.event(
            "response.in_progress", response=self.head
        )

    def keepalive(self) -> bytes:
        return self.event("response.in_progress", response=self.head)

    def error(self, status: int, kind: str, message: str) -> bytes:
        """`response.failed`, as the Responses API ends a stream that failed: the response
        with status `failed` and its `error` (Codex reports `error.message`; a bare error
        frame it drops, and says only that the stream closed early)."""
        code = "server_error" if status >= 500 else kind
        failed = {**self.head, "status": "failed", "error": {"code": code, "message": message}}
        return self.event("response.failed", response=failed)

    def _at(self) -> dict[str, Any]:
        assert self.key is not None
        return {"item_id": self.item_ids[self.key], "output_index": self.items - 1}

    def _begin(self, key: str, kind: str, item: dict[str, Any]) -> bytes:
        frames = self._end()
        self.key, self.kind, self.text, self.canonical, self.decoded = key, kind, "", "", 0
        self.items += 1
        item = {"type": kind, "id": item_id(self.item_ids, key, kind), **item}
        frames += self.event("response.output_item.added", output_index=self.items - 1, item=item)
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            at = self._at()
            frames += self.event("response.content_part.added", **at, content_index=0, part=part)
        return frames

    def _final(self) -> dict[str, Any]:
        """The open item as it stands, finished (what the reply holds when nothing changed)."""
        item_id_ = self.item_ids[self.key or ""]
        if self.kind == "reasoning":
            return reasoning_item(item_id_, self.text)
        if self.kind == "message":
            return message_item(item_id_, self.text)
        if self.kind == "custom_tool_call":
            try:
                arguments = json.loads(self.canonical)
            except ValueError:
                arguments = {}
            text = custom_input(arguments) if isinstance(arguments, dict) else self.text
            return {**self.call, "status": "completed", "input": text}
        return {**self.call, "status": "completed", "arguments": self.text}

    def _end(self, final: dict[str, Any] | None = None) -> bytes:
        """The open item's `done` events, with `final` (the reply's item) or as it stands."""
        if self.key is None:
            return b""
        item = final if final is not None else self._final()
        at, event = self._at(), self.event
        if self.kind == "reasoning":
            text = item["content"][0]["text"]
            frames = event("response.reasoning_text.done", **at, content_index=0, text=text)
        elif self.kind == "message":
            part = item["content"][0]
            frames = self._more(part["text"])
            frames += event(
                "response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[]
            )
            frames += event("response.content_part.done", **at, content_index=0, part=part)
        elif self.kind == "function_call":
            arguments = item["arguments"]
            frames = self._more(arguments)
            frames += event("response.function_call_arguments.done", **at, arguments=arguments)
        else:
            frames = self._more(item["input"])
            frames += event("response.custom_tool_call_input.done", **at, input=item["input"])
        frames += event("response.output_item.done", output_index=self.items - 1, item=item)
        self.key = None
        return frames

    def _more(self, final: str) -> bytes:
        """The rest of the open item's text up to `final`, if what went out is its prefix."""
        if len(final) <= len(self.text) or not final.startswith(self.text):
            return b""
        return self._text(final[len(self.text) :])

    def _text(self, piece: str) -> bytes:
        """More of the open item's text, as its kind's delta."""
        self.text += piece
        at = self._at()
        if self.kind == "reasoning":
            return self.event("response.reasoning_text.delta", **at, content_index=0, delta=piece)
        if self.kind == "message":
            return self.event(
                "response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[]
            )
        if self.kind == "function_call":
            return self.event("response.function_call_arguments.delta", **at, delta=piece)
        return self.event("response.custom_tool_call_input.delta", **at, delta=piece)

    def _custom(self, fragment: str) -> bytes:
        """A free-form call's arguments JSON decoded into its input as far as it is whole."""
        self.canonical += fragment
        head = json.dumps({CUSTOM_INPUT: ""})[:-2]
        if not self.canonical.startswith(head):
            return b""
        match = _ESCAPED_RUN.match(self.canonical, max(self.decoded, len(head)))
        if match is None or not match.group():
            return b""
        self.decoded = match.end()
        return self._text(json.loads(f'"{match.group()}"'))

    def delta(self, out: StreamDeltas) -> bytes:
        frames = b""
        if out.reasoning:
            if self.key != "reasoning":
                item: dict[str, Any] = {"summary": [], "content": [], "encrypted_content": None}
                frames += self._begin("reasoning", "reasoning", item)
            frames += self._text(out.reasoning)
        if out.content:
            if self.key != "message":
                message = {"status": "in_progress", "role": "assistant", "content": []}
                frames += self._begin("message", "message", message)
            frames += self._text(out.content)
        for call in out.calls:
            key = f"call:{call.index}"
            if call.name:
                frames += self._begin_call(key, call.index, call.name)
            if call.arguments and self.key == key:
                if self.kind == "custom_tool_call":
                    frames += self._custom(call.arguments)
                else:
                    frames += self._text(call.arguments)
        return frames

    def _begin_call(self, key: str, index: int, name: str) -> bytes:
        kind = call_kind(name, self.tools)
        call_id = self.call_id(index)
        final: dict[str, Any]
        if kind == "custom_tool_call":
            final = {"call_id": call_id, "name": name}
            added = {"status": "in_progress", **final, "input": ""}
        else:
            final = {"name": name, "arguments": "", "call_id": call_id}
            if name in self.tools.namespaced:
                final["namespace"], final["name"] = self.tools.namespaced[name]
            added = {"status": "in_progress", **final}
        frames = self._begin(key, kind, added)
        self.call = {"type": kind, "id": self.item_ids[key], "status": "completed", **final}
        return frames

    def close(self, reply: dict[str, Any], rest: StreamDeltas) -> bytes:
        frames = self.delta(rest)
        output = reply["output"]
        open_at = self.items - 1 if self.key is not None else -1
        open_id = self.item_ids.get(self.key or "")
        if 0 <= open_at < len(output) and output[open_at]["id"] == open_id:
            frames += self._end(output[open_at])
        else:
            frames += self._end()
        # Items that never went out as sampled (output the whole parse read otherwise).
        for index in range(self.items, len(output)):
            frames += b"".join(_item_events(self.event, index, output[index]))
        return frames + self.event("response.completed", response=reply)


@register_protocol
class OpenAIResponses(ResumableProtocol):
    name = "responses"
    turn_path = "/v1/responses"
    count_tokens_path = "/v1/responses/input_tokens"
    path_prefixes = ("/v1/responses",)
    array_field = "input"
    context_fields = frozenset({"instructions", "tools", "tool_choice"})
    fields = RESPONSES
    count_fields = RESPONSES

    def translate_from(
        self, body: dict[str, Any], previous: Translated | None, first_changed: int
    ) -> Translated:
        return translate_from(body, previous, first_changed)

    def continues(self, body: Mapping[str, Any]) -> str | None:
        ref = body.get("previous_response_id")
        if ref is not None and (not isinstance(ref, str) or not ref):
            raise RequestError("previous_response_id must be a non-empty string")
        return ref

    def translate_after(
        self, body: dict[str, Any], prior: list[Message], prior_calls: list[str]
    ) -> Conversation:
        return translate_request(body, prior, prior_calls)[0]

    def withheld_tools(self, body: Mapping[str, Any]) -> list[str]:
        return read_tools(body.get("tools")).withheld

    def sampling(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return sampling_keys(body, "max_output_tokens", "stop")

    def mint_call_id(self) -> str:
        return mint_id("call_")

    def mint_reply_id(self) -> str:
        return mint_id("resp_")

    def reply(self, outcome: Outcome) -> dict[str, Any]:
        tools = read_tools(outcome.body.get("tools"))
        status = "incomplete" if outcome.finish_reason == "length" else "completed"
        return response_object(outcome, outcome.body, output_items(outcome, tools), status)

    def stream(self, reply: dict[str, Any], body: Mapping[str, Any]) -> Iterator[bytes]:
        return stream_events(reply)

    def live(
        self, body: Mapping[str, Any], reply_id: str, model: str, prompt_tokens: int
    ) -> LiveStream:
        return ResponsesLive(self, body, reply_id, model, prompt_tokens)

    def error_body(self, status: int, kind: str, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}

    def count_tokens_reply(self, tokens: int) -> dict[str, Any]:
        return {"object": "response.input_tokens", "input_tokens": tokens}
