"""The adapter's listening socket: a cap on open connections, idle connections closed, and
malformed HTTP answered as JSON.

Each connection costs a file descriptor; thousands of half-open ones (connected, never sending a
request) would exhaust them and starve real turns. `ConnectionGuard` keeps at most `cap` open:
at the cap a new connection closes the one idle longest (no request in progress), and only when
every connection is busy is the newcomer answered 503 with `Retry-After`. Connections without a
request are closed after the idle timeout in any case (aiohttp's keep-alive timer, which also
runs before the first request). `GuardedHandler` also answers what aiohttp's HTTP parser refuses
(a header line over the limit, a malformed request line) in the JSON error shape.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web, web_protocol
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_request import BaseRequest

from tokentrail.adapter.middleware import Handler, error_response

logger = logging.getLogger(__name__)

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

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._guard.admit(self):
            assert isinstance(transport, asyncio.Transport)
            transport.write(_refusal())
            transport.close()
            return
        self._admitted = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._guard.closed(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._admitted:
            super().data_received(data)

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
