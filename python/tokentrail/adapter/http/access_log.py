"""`serve --access-log`: one line per request (method, route, status, session, duration, prompt
and output tokens), as text or as a JSON object, written to stderr or appended to a file.

Off by default. A request the client gave up on is logged with status 499.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tokentrail.adapter.http import notes as request_notes
from tokentrail.adapter.http.middleware import Handler

__all__ = ["AccessLog", "access_log_middleware"]

# The status logged for a request whose client went away before an answer.
CLIENT_GONE = 499


@dataclass(frozen=True)
class AccessLog:
    """Where the lines go (`-`: stderr, else a file appended to) and whether they are JSON."""

    destination: str = "-"
    json: bool = False

    def logger(self) -> logging.Logger:
        """The `tokentrail.access` logger writing bare lines to the destination."""
        log = logging.getLogger("tokentrail.access")
        log.setLevel(logging.INFO)
        log.propagate = False
        for old in list(log.handlers):
            log.removeHandler(old)
            old.close()
        handler: logging.Handler
        if self.destination == "-":
            handler = logging.StreamHandler(sys.stderr)
        else:
            handler = logging.FileHandler(self.destination, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        return log


def access_log_middleware(config: AccessLog) -> Any:
    """A middleware (outermost) writing one line per request answered or abandoned."""
    log = config.logger()

    @web.middleware
    async def access_log(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        status = CLIENT_GONE
        try:
            response = await handler(request)
            status = response.status
            return response
        finally:
            notes = request_notes.current()
            resource = request.match_info.route.resource
            entry = {
                "method": request.method,
                "route": resource.canonical if resource is not None else request.path,
                "status": status,
                "session": notes.session,
                "duration_ms": round(1000 * (time.perf_counter() - start), 1),
                "prompt_tokens": notes.prompt_tokens,
                "output_tokens": notes.output_tokens,
            }
            if config.json:
                log.info(json.dumps(entry, separators=(",", ":")))
            else:
                log.info(" ".join(f"{k}={'-' if v is None else v}" for k, v in entry.items()))

    return access_log
