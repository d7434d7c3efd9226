"""The adapter's listening socket: a cap on open connections, idle connections closed, and
malformed HTTP answered as JSON.

Each connection costs a file descriptor; thousands of half-open ones (connected, never sending a
request) would exhaust them and starve real turns. `ConnectionGuard` keeps at most `cap` open:
at the cap a new connection closes the one idle longest (no request in progress), and only when
every connection is busy is the newcomer answered 503 with `Retry-After`. Connections without a
request are closed after the idle timeout in any case (aiohttp's keep-alive timer, which also
runs before the first request). `GuardedHandler` also answers what aiohttp's HTTP parser refuses
(a header line over the limit, a malformed request line) in the JSON error shape, and answers
a request whose client half-closed the connection after sending it (`eof_received`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import HttpVersion11, StreamReader, web, web_protocol
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_request import BaseRequest

from tokentrail.adapter.http.middleware import Handler, error_response
from tokentrail.errors import BodyCutShort

logger = logging.getLogger(__name__)

# Linux's TCP_CLOSE: what a connection's state becomes when the peer resets it.
_TCP_CLOSE = 7
# How often a half-closed connection with a request in progress is checked for a reset.
_RESET_POLL_S = 0.1

__all__ = ["ConnectionGuard", "GuardedSite", "mark_busy"]


class ConnectionGuard:
    """Open connections, least recently active first, and which of them run a request."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._open: dict[web_protocol.RequestHandler, None] = {}
        self._busy: dict[web_protocol.RequestHandler, int] = {}
        self.closed_idle = 0
        self.refused = 0

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, handler: web_protocol.RequestHandler) -> bool:
        """Make room for a new connection; False when every open one is busy."""
        if len(self._open) >= self.cap:
            victim = next((h for h in self._open if h not in self._busy), None)
            if victim is None:
                self.refused += 1
                return False
            del self._open[victim]
            self.closed_idle += 1
            victim.force_close()
        self._open[handler] = None
        return True

    def closed(self, handler: web_protocol.RequestHandler) -> None:
        self._open.pop(handler, None)
        self._busy.pop(handler, None)

    def busy(self, handler: web_protocol.RequestHandler) -> None:
        self._busy[handler] = self._busy.get(handler, 0) + 1

    def idle(self, handler: web_protocol.RequestHandler) -> None:
        left = self._busy.get(handler, 0) - 1
        if left > 0:
            self._busy[handler] = left
            return
        self._busy.pop(handler, None)
        if handler in self._open:  # now the most recently active
            del self._open[handler]
            self._open[handler] = None


def _refusal() -> bytes:
    body = json.dumps(
        {
            "error": {
                "message": "too many open connections, all busy; retry shortly",
                "type": "overloaded_error",
                "code": 503,
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Retry-After: 1\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class GuardedHandler(web_protocol.RequestHandler):
    """aiohttp's connection handler, admitted by a `ConnectionGuard`, with JSON errors."""

    def __init__(self, guard: ConnectionGuard, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._admitted = False
        # The peer has sent its last byte (see `eof_received`).
        self._peer_done = False
        self._watcher: asyncio.Future[None] | None = None
        # The latest request parsed (its message and body stream), and how many were answered.
        self._latest: tuple[Any, StreamReader] | None = None
        self._answered = 0
        # The request whose answer `finish_response` is writing.
        self._finishing: BaseRequest | None = None
        # What a streamed answer in progress does when the peer sends its last byte.
        self._on_peer_done: list[Callable[[], None]] = []

    def when_peer_done(self, callback: Callable[[], None]) -> None:
        """Call `callback` if the peer sends its last byte while the answer in progress
        streams (`adapter.turn.live`: a keepalive then goes out at once, which the reset of a peer
        that left entirely answers)."""
        self._on_peer_done.append(callback)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._guard.admit(self):
            assert isinstance(transport, asyncio.Transport)
            # A 5xx the middleware never sees: logged here, as it would log one.
            logger.warning(
                "a new connection answered 503: %d connections open, all busy (--max-connections)",
                len(self._guard),
            )
            transport.write(_refusal())
            transport.close()
            return
        self._admitted = True
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._admitted:
            super().data_received(data)
            if self._messages:
                self._latest = self._messages[-1]

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio reads a bool here
        """The peer sent its last byte (`shutdown(SHUT_WR)`, as `nc -N` and some HTTP/1.0
        clients do, or a full close). aiohttp closes the transport here, which cancels a
        request in progress unanswered; a peer that only stopped sending still reads. So a
        connection with a request not yet answered stays open for the answers, and closes
        after the last; a body cut short is refused at once (400) instead of waiting for the
        body timeout. HTTP/1.1 peers get a `100 Continue`: one that closed entirely answers it
        with a reset, and its turn is abandoned as before (`_watch_reset`)."""
        if not self._admitted or self._latest is None or self._answered >= self._request_count:
            return False  # nothing asked: the end of the connection, as before
        self._peer_done = True
        message, payload = self._latest
        if not payload.is_eof():
            length = getattr(message, "headers", {}).get("Content-Length")
            cut = BodyCutShort(payload.total_bytes, int(length) if length else None)
            payload.set_exception(cut)
        http11 = getattr(message, "version", None) == HttpVersion11
        if self.transport is not None and http11 and not self._answer_started():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._watcher = asyncio.ensure_future(self._watch_reset())
        elif self.transport is not None and self._on_peer_done:
            # A streamed answer may stall (the engine queues or prefills): it writes now, and
            # the watcher sees the reset that write meets from a peer gone entirely.
            for callback in self._on_peer_done:
                callback()
            self._watcher = asyncio.ensure_future(self._watch_reset())
        # Otherwise the answer's own writes meet the reset of a peer that left.
        return True

    def _answer_started(self) -> bool:
        """Whether bytes of a final answer are on the wire (no interim answer may come then)."""
        request = self._current_request or self._finishing
        writer = getattr(request, "_payload_writer", None)
        return bool(writer is not None and writer.output_size)

    async def _watch_reset(self) -> None:
        """Abort the connection (cancelling its handler, as a lost connection does) once the
        peer resets it; stop when the connection ends."""
        transport = self.transport
        if transport is None:
            return
        sock = transport.get_extra_info("socket")
        tcp_info = getattr(socket, "TCP_INFO", None)
        if sock is None or tcp_info is None:
            return  # no TCP state to read here: the answer is written, read or not
        while self.transport is transport and not transport.is_closing():
            try:
                state = sock.getsockopt(socket.IPPROTO_TCP, tcp_info, 1)[0]
            except OSError:
                state = _TCP_CLOSE
            if state == _TCP_CLOSE:
                logger.debug("the peer reset a half-closed connection: its request is abandoned")
                transport.abort()
                return
            await asyncio.sleep(_RESET_POLL_S)

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        self._answered += 1
        if self._peer_done and self._answered >= self._request_count:
            resp.force_close()  # the peer's last request: no more can come
        self._finishing = request
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._finishing = None
            self._on_peer_done.clear()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if not self._admitted:
            return
        self._guard.closed(self)
        super().connection_lost(exc)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        if isinstance(exc, LineTooLong):
            status = 431
        text = message or (str(exc) if exc else "bad request")
        kind = "request_too_large" if status == 431 else "invalid_request_error"
        response = error_response("/", status, kind, f"malformed HTTP request: {text}")
        response.force_close()
        return response


class GuardedSite(web.BaseSite):
    """A TCP site whose connections pass a `ConnectionGuard` and use `GuardedHandler`."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        guard: ConnectionGuard,
        *,
        backlog: int = 128,
        **handler_kwargs: Any,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._guard = guard
        self._handler_kwargs = handler_kwargs

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None

        def connection() -> GuardedHandler:
            return GuardedHandler(self._guard, server, loop=loop, **self._handler_kwargs)

        self._server = await loop.create_server(
            connection, self._host, self._port, backlog=self._backlog, reuse_address=True
        )


def mark_busy(guard: ConnectionGuard) -> Any:
    """A middleware that marks a connection busy while a request runs on it, so the guard
    never closes a connection in the middle of a turn."""

    @web.middleware
    async def busy(request: web.Request, handler: Handler) -> web.StreamResponse:
        protocol = request.protocol
        if not isinstance(protocol, web_protocol.RequestHandler):
            return await handler(request)
        guard.busy(protocol)
        try:
            return await handler(request)
        finally:
            guard.idle(protocol)

    return busy
