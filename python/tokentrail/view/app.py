"""The viewer's web app: one page (HTML, JS and CSS shipped in the package, nothing fetched
from the network) and a JSON API over a `SessionSource`.

`tokentrail view PATH` serves it alone on 127.0.0.1, behind its own token and Host allow-list
(`view.access`); a running adapter mounts the same routes at `/tokentrail/ui` behind its admin
token (`guard`): the page and its assets hold no data and are open, every API route calls the
guard first. Every response carries the security headers (`view.access.SECURITY_HEADERS`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from aiohttp import web

from tokentrail.errors import NotFound, RequestError, TokentrailError
from tokentrail.view.access import ViewAccess, with_security_headers
from tokentrail.view.sources import SessionSource

logger = logging.getLogger(__name__)

__all__ = ["UI_PREFIX", "Viewer", "standalone_app"]

UI_PREFIX = "/tokentrail/ui"
_ASSETS = {
    "app.js": "text/javascript",
    "style.css": "text/css",
}
Guard = Callable[[web.Request], None]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _asset(name: str) -> bytes:
    return resources.files("tokentrail.view").joinpath("static").joinpath(name).read_bytes()


class Viewer:
    """The page and the API over `source`; `guard` raises for a request that may not read."""

    def __init__(self, source: SessionSource, guard: Guard | None = None) -> None:
        self.source = source
        self.guard = guard
        # Read once: the assets ship with the package and do not change while it runs.
        self._index = _asset("index.html")
        self._assets = {name: _asset(name) for name in _ASSETS}

    def routes(self, prefix: str = "") -> list[web.RouteDef]:
        api = f"{prefix}/api"
        out = [
            web.get(f"{prefix}/", self.index),
            web.get(f"{prefix}/static/{{name}}", self.static),
            web.get(f"{api}/source", self.describe),
            web.get(f"{api}/sessions", self.sessions),
            web.get(f"{api}/sessions/{{sid}}", self.session),
            web.get(f"{api}/sessions/{{sid}}/turns/{{turn}}", self.turn),
        ]
        if prefix:
            out.append(web.get(prefix, self.to_index))
        return out

    async def to_index(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(f"{request.path}/")

    async def index(self, request: web.Request) -> web.StreamResponse:
        response = web.Response(body=self._index, content_type="text/html", charset="utf-8")
        return with_security_headers(response)

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        body = self._assets.get(name)
        if body is None:
            raise NotFound(f"no asset {name!r}")
        response = web.Response(body=body, content_type=_ASSETS[name], charset="utf-8")
        return with_security_headers(response)

    async def _json(self, request: web.Request, read: Callable[[], Any]) -> web.StreamResponse:
        if self.guard is not None:
            self.guard(request)
        # Linearizing a session and reading a journal take a while: off the event loop.
        body = await asyncio.to_thread(read)
        response = web.json_response(body, headers={"Cache-Control": "no-store"})
        return with_security_headers(response)

    async def describe(self, request: web.Request) -> web.StreamResponse:
        return await self._json(request, self.source.describe)

    async def sessions(self, request: web.Request) -> web.StreamResponse:
        return await self._json(
            request,
            lambda: {"source": self.source.describe(), "sessions": self.source.summaries()},
        )

    async def session(self, request: web.Request) -> web.StreamResponse:
        sid = request.match_info["sid"]
        return await self._json(request, lambda: self.source.detail(sid))

    async def turn(self, request: web.Request) -> web.StreamResponse:
        sid, raw = request.match_info["sid"], request.match_info["turn"]
        try:
            turn_index = int(raw)
        except ValueError:
            raise RequestError(f"turn must be a turn index (an integer), not {raw!r}") from None
        return await self._json(request, lambda: self.source.turn(sid, turn_index))


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A named error as `{"error": {"type", "message"}}` with its status; every response with
    the security headers."""
    try:
        return with_security_headers(await handler(request))
    except TokentrailError as exc:
        body = {"error": {"type": exc.kind, "message": str(exc)}}
        return with_security_headers(web.json_response(body, status=exc.status))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = f"no route {request.method} {request.path}" if exc.status == 404 else exc.reason
        return with_security_headers(
            web.json_response(
                {"error": {"type": "not_found_error", "message": message}}, status=exc.status
            )
        )


def standalone_app(source: SessionSource, access: ViewAccess | None = None) -> web.Application:
    """The viewer alone (`tokentrail view`), behind `access`: its token and Host allow-list
    (None: the Host allow-list and no token, for a viewer in a test's own process)."""
    access = access or ViewAccess(token=None)
    app = web.Application(middlewares=[_errors, access.middleware])
    app.add_routes(Viewer(source).routes())
    return app
