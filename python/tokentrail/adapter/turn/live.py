"""A streamed reply written while its turn is sampled: the 200 and the protocol's opening frame
go out before the engine is called, each run of sampled tokens is decoded and parsed
(`text.stream_parsing`) and what is certain goes out at once as the protocol's deltas (tool
calls too, for the formats `text.stream_calls` reads), a keepalive goes out whenever nothing
else did for `keepalive_s`, and the finished reply's closing frames (what the parser held back,
finish reason, usage) go out once the turn is journaled. A stream that turns out not to be a
prefix of the whole parse (ill-formed output) is counted by `on_mismatch`.

What the harness was sent is kept beside the tokens, so a turn cut short by a client that went
away can still be recorded for what it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from tokentrail.adapter.http.connections import GuardedHandler
from tokentrail.adapter.protocols import WireProtocol
from tokentrail.adapter.protocols.base import LiveStream
from tokentrail.adapter.protocols.sse import KEEPALIVE_S
from tokentrail.messages import Message, ToolSchema
from tokentrail.text.stream_parsing import StreamDecoder, StreamDeltas, StreamParser
from tokentrail.text.tokenizer import LoadedTokenizer
from tokentrail.trajectory.prefill import Prefill

logger = logging.getLogger(__name__)

__all__ = ["KEEPALIVE_S", "LiveReply"]

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class LiveReply:
    """One streamed reply, from `start` to `finish` (or `fail`)."""

    def __init__(
        self,
        request: web.Request,
        proto: WireProtocol,
        body: Mapping[str, Any],
        *,
        tokenizer: LoadedTokenizer,
        tool_parser: str | None,
        reasoning_parser: str | None,
        prompt_opens_reasoning: bool,
        model: str,
        prompt_tokens: int,
        tools: Sequence[ToolSchema] | None = None,
        keepalive_s: float = KEEPALIVE_S,
        on_mismatch: Callable[[], None] | None = None,
        prefill: Prefill | None = None,
    ) -> None:
        self.request = request
        self.reply_id = proto.mint_reply_id()
        self.stream: LiveStream = proto.live(body, self.reply_id, model, prompt_tokens)
        self.decoder = StreamDecoder(tokenizer)
        self.parser = StreamParser(
            tool_parser, reasoning_parser, prompt_opens=prompt_opens_reasoning, tools=tools
        )
        self.on_mismatch = on_mismatch
        # A prefill's reply is its continuation: the parser reads the prefill's text first, as
        # the whole parse does, and of what it hands out the prefill's own reasoning and content
        # (the harness holds them) are left out, however the parser splits them.
        self._skip = [0, 0]
        if prefill is not None:
            message = prefill.message
            self._skip = [
                len(str(message.get("reasoning_content") or "")),
                len(str(message.get("content") or "")),
            ]
            self._beyond_prefill(self.parser.feed(prefill.text))
        self.keepalive_s = keepalive_s
        self.response: web.StreamResponse | None = None
        self._pending = bytearray()
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        # The tokens sampled so far, as the engine streamed them.
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        # When the first token arrived and when its frame was written (perf_counter), and how
        # many keepalives went out: what the docs' figures are measured from.
        self.first_token_at: float | None = None
        self.first_write_at: float | None = None
        self.keepalives = 0
        # False when what went out is not a prefix of the whole parse (ill-formed output).
        self.matched = True
        # The message the whole parse gave, a prefill's included (set once the turn is parsed).
        self.parsed_reply: Message = {"role": "assistant", "content": ""}

    @property
    def started(self) -> bool:
        return self.response is not None

    async def start(self) -> None:
        """The 200 and the opening frame; from here on, keepalives."""
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(self.request)
        self.response = response
        if isinstance(self.request.protocol, GuardedHandler):
            # A client gone while the engine stalls is found by the next write: make one.
            self.request.protocol.when_peer_done(self._wake.set)
        await response.write(self.stream.open())
        self._writer = asyncio.ensure_future(self._write_loop())

    def sink(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        """Take a run of sampled tokens (on the loop, as the engine streams them)."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.ids.extend(ids)
        self.logprobs.extend(logprobs)
        text = self.decoder.feed(ids)
        if not text:
            return
        out = self._beyond_prefill(self.parser.feed(text))
        if out:
            self._pending += self.stream.delta(out)
            self._wake.set()

    def _beyond_prefill(self, out: StreamDeltas) -> StreamDeltas:
        """`out` less what is still the prefill's own reasoning and content."""
        r, c = self._skip
        if not (r or c):
            return out
        self._skip = [max(0, r - len(out.reasoning)), max(0, c - len(out.content))]
        return StreamDeltas(out.reasoning[r:], out.content[c:], out.calls)

    async def _write_loop(self) -> None:
        assert self.response is not None
        loop = asyncio.get_running_loop()
        while True:
            # A timer, not `wait_for` (a task per wake-up, per token): it only sets the event.
            timer = loop.call_later(self.keepalive_s, self._wake.set)
            await self._wake.wait()
            timer.cancel()
            self._wake.clear()
            if self._pending:
                data = bytes(self._pending)
                self._pending.clear()
                await self.response.write(data)
                if self.first_write_at is None:
                    self.first_write_at = time.perf_counter()
            else:
                self.keepalives += 1
                await self.response.write(self.stream.keepalive())

    async def _stop_writer(self) -> None:
        if self._writer is None:
            return
        writer, self._writer = self._writer, None
        if writer.done():
            writer.result()  # a write that failed (the client went away) raises here
            return
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer

    async def finish(self, reply: dict[str, Any], message: Message) -> web.StreamResponse:
        """The rest of the reply once the turn is kept: what the parser still held, checked
        against the whole parse `message`, then the protocol's closing frames."""
        assert self.response is not None
        await self._stop_writer()
        tail = self.decoder.finish()
        if tail:
            self._pending += self.stream.delta(self._beyond_prefill(self.parser.feed(tail)))
        rest, self.matched = self.parser.finish(message)
        rest = self._beyond_prefill(rest)
        if not self.matched:
            logger.debug(
                "reply %s: what was streamed is not a prefix of the parsed message "
                "(ill-formed output); the rest goes out as parsed",
                self.reply_id,
            )
            if self.on_mismatch is not None:
                self.on_mismatch()
        data = bytes(self._pending) + self.stream.close(reply, rest)
        self._pending.clear()
        await self.response.write(data)
        if self.first_write_at is None:
            self.first_write_at = time.perf_counter()
        await self.response.write_eof()
        transport = self.request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("client disconnected before the response was flushed")
        return self.response

    async def fail(self, status: int, kind: str, message: str) -> web.StreamResponse:
        """An error after the 200: the protocol's in-stream error event, then the end."""
        assert self.response is not None
        with contextlib.suppress(Exception):
            await self._stop_writer()
        with contextlib.suppress(ConnectionError):
            await self.response.write(self.stream.error(status, kind, message))
            await self.response.write_eof()
        return self.response

    async def abandon(self) -> None:
        """Stop writing (the client went away, or the turn was cancelled)."""
        with contextlib.suppress(Exception):
            await self._stop_writer()
