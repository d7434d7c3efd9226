"""The adapter's one error middleware: every exception a handler raises becomes a JSON answer
in the shape of the protocol its path belongs to, with the status its type names.

`TokentrailError` subclasses carry their status and error type (`tokentrail.errors`); an
`EngineError` is a 502; an `Overloaded` 503 says when to retry in `Retry-After`; aiohttp's own
refusals (unknown route 404, wrong method 405, a body over the size limit 413) are rewritten
into the same shapes; anything else is answered 500, never as a bare text page.

Every 5xx answered here is logged once at WARNING with its reason, the session and the engine
request id (`adapter.http.notes`): an operator sees why without a proxy in front.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from tokentrail.adapter.http import notes as request_notes
from tokentrail.adapter.protocols import WireProtocol, protocol_for_path, protocols
from tokentrail.errors import EngineError, Overloaded, OverMemory, TokentrailError

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_HTTP_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
}
# After these the rest of the body may still be on its way (or never come): close the
# connection rather than read it.
_CLOSE_AFTER = frozenset({408, 413})


def error_response(path: str, status: int, kind: str, message: str) -> web.Response:
    """A JSON error in the shape of the protocol `path` belongs to (OpenAI's by default)."""
    proto = protocol_for_path(path) or _default_protocol()
    return web.json_response(proto.error_body(status, kind, message), status=status)


def _default_protocol() -> WireProtocol:
    return next(p for p in protocols() if p.name == "openai")


def _answered(request: web.Request, status: int, message: str) -> None:
    """Log a 5xx once, with what an operator needs to find it."""
    if status >= 500:
        logger.warning(
            "%s %s answered %d: %s (%s)",
            request.method,
            request.path,
            status,
            message,
            request_notes.current().where(),
        )


def failed_in_stream(request: web.Request, status: int, message: str) -> None:
    """Log, once, an error sent inside a stream whose 200 already went out: the same line a
    5xx gets, since the status line cannot say it."""
    logger.warning(
        "%s %s failed in the stream (%d after the 200): %s (%s)",
        request.method,
        request.path,
        status,
        message,
        request_notes.current().where(),
    )


def status_of(exc: BaseException, path: str | None = None) -> int:
    """The HTTP status an exception reaching a handler is answered with (on `path`): the one
    place that maps one to the other (the middleware answers with it, the metrics count it)."""
    if isinstance(exc, OverMemory) and path is not None:
        return _busy(exc, path)[0]
    if isinstance(exc, TokentrailError | web.HTTPException):
        return exc.status
    return 500


def _busy(exc: OverMemory, path: str) -> tuple[int, str]:
    proto = protocol_for_path(path) or _default_protocol()
    return exc.by_protocol.get(proto.name, (exc.status, exc.kind))


def _answer(request: web.Request, exc: TokentrailError | web.HTTPException) -> web.Response:
    status = status_of(exc, request.path)
    if isinstance(exc, OverMemory):
        kind = _busy(exc, request.path)[1]
        message = str(exc)
    elif isinstance(exc, TokentrailError):
        kind = exc.kind
        message = f"engine error: {exc}" if isinstance(exc, EngineError) else str(exc)
    else:
        kind = _HTTP_KINDS.get(status, "api_error")
        message = exc.text or exc.reason
        if status == 404:
            message = f"no route {request.method} {request.path}"
        elif status == 405:
            message = f"{request.method} is not allowed on {request.path}"
        elif status == 413:
            message = f"request body too large: {exc.text}"
    _answered(request, status, message)
    response = error_response(request.path, status, kind, message)
    if isinstance(exc, Overloaded):
        response.headers["Retry-After"] = str(exc.retry_after_s)
    if status in _CLOSE_AFTER:
        response.force_close()
    return response


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    request_notes.begin()
    try:
        response = await handler(request)
    except TokentrailError as exc:
        return _answer(request, exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _answer(request, exc)
    except ConnectionResetError:
        raise  # the client went away: nobody to answer
    except Exception as exc:
        logger.warning(
            "%s %s answered 500: internal error %s: %s (%s)",
            request.method,
            request.path,
            type(exc).__name__,
            exc,
            request_notes.current().where(),
            exc_info=True,
        )
        return error_response(request.path, 500, "api_error", "internal error (logged)")
    if response.status >= 500:
        _answered(request, response.status, response.reason or "")
    return response
