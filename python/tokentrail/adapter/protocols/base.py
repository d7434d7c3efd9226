"""The interface every wire protocol implements (`WireProtocol`: its routes, translation,
sampling keys, replies, SSE and error shape), and the stream a protocol writes while a reply is
sampled unless it writes its own (`LiveStream`: the whole reply once done, keepalives before)."""

from __future__ import annotations

import copy
import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, TypeVar

from tokentrail.adapter.protocols.fields import Spec
from tokentrail.adapter.protocols.ids import bearer, mint_id
from tokentrail.adapter.protocols.options import DEFAULT_WIRE, WireOptions
from tokentrail.adapter.protocols.outcome import Outcome
from tokentrail.errors import AuthenticationError, RequestError
from tokentrail.messages import Conversation, Message
from tokentrail.text.stream_parsing import StreamDeltas

__all__ = ["LiveStream", "WireProtocol", "fill_call_ids"]


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


def fill_call_ids(proto: WireProtocol, given: list[str], count: int) -> list[str]:
    """The ids of a reply's `count` tool calls: those in `given` (a live stream sent them),
    then fresh ones, which join `given`. The one place call ids are minted."""
    while len(given) < count:
        given.append(proto.mint_call_id())
    return given[:count]
