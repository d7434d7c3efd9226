"""HTTP plumbing shared by the SGLang and vLLM clients: one `aiohttp.ClientSession` per event
loop, JSON in and out, every failure an `EngineError` carrying the engine's own message."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from tokentrail.engines.base import (
    REQUEST_ID_HEADER,
    ROUTING_HEADER,
    SESSION_HEADER,
    GenerateRequest,
)
from tokentrail.errors import EngineError, EngineOutputError, EngineSpecError
from tokentrail.kinds import EngineFault

logger = logging.getLogger(__name__)


def answer_limit(max_new_tokens: int) -> int:
    """Bytes a generation's answer may take: a megabyte, plus a kilobyte per token asked for
    (SGLang writes ~30 bytes per token, vLLM with logprobs ~150)."""
    return 1024 * 1024 + 1024 * max(0, max_new_tokens)


def base_url(spec: str, address: str) -> str:
    """`HOST:PORT` or a full `http(s)://host:port` URL as a base URL; refuses anything else."""
    if not address.startswith(("http://", "https://")):
        address = "http://" + address
    parts = urlsplit(address.rstrip("/"))
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        parts = parts._replace(netloc="")
    if not parts.hostname or parts.path or parts.query or parts.fragment:
        raise EngineSpecError(
            f"engine spec {spec!r} needs HOST:PORT, e.g. sglang://127.0.0.1:30000"
        )
    return f"{parts.scheme}://{parts.netloc}"


class HTTPEngine:
    """One `aiohttp.ClientSession` per event loop, JSON in and out, errors as `EngineError`."""

    name = "http"

    def __init__(self, base_url: str, *, timeout: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Strong references to fire-and-forget aborts, so they are not collected mid-flight.
        self._background: set[asyncio.Task[None]] = set()

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        # A session belongs to the loop it was made in; a new loop (each `asyncio.run`) needs
        # its own. The old one cannot be closed from here and is dropped.
        if self._session is None or self._session.closed or self._loop is not loop:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
            self._loop = loop
        return self._session

    def _headers(self, req: GenerateRequest) -> dict[str, str]:
        sid = header_value(req.session_id)
        return {
            ROUTING_HEADER: sid,
            SESSION_HEADER: sid,
            REQUEST_ID_HEADER: header_value(req.request_id),
        }

    async def _request_json(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_bytes: int | None = None,
    ) -> Any:
        """The JSON answer of one call; `max_bytes` bounds the answer read (a generation's
        answer cannot be bigger than its tokens make it)."""
        url = self.base_url + path
        kwargs: dict[str, Any] = {"headers": dict(headers or {})}
        if body is not None:
            kwargs["json"] = body
        if timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout)
        try:
            async with self._client().request(method, url, **kwargs) as resp:
                status = resp.status
                if max_bytes is None:
                    raw = await resp.read()
                else:
                    raw = await resp.content.read(max_bytes + 1)
                    if len(raw) > max_bytes:
                        raise EngineOutputError(
                            EngineFault.TOO_LONG,
                            f"{self.name} answered {path} with more than {max_bytes} bytes, "
                            "more than the tokens asked for can take",
                        )
        except asyncio.TimeoutError:  # aiohttp's timeout; not yet the builtin one on 3.10
            raise EngineError(
                f"{self.name} did not answer {path} within {timeout or self.timeout:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise EngineError(f"cannot reach {self.name} at {url}: {exc}") from None
        if not 200 <= status < 300:
            raise EngineError(f"{self.name}: {error_message(raw)}", status)
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EngineError(f"{self.name} answered {path} with invalid JSON", status) from None

    async def _abort_in_background(self, coro: Any) -> None:
        """Run an abort to completion even if the caller is cancelled again meanwhile."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            pass  # the abort goes on in the background; the caller re-raises its own cancel

    async def close(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._session is not None and not self._session.closed:
            if self._loop is asyncio.get_running_loop():
                await self._session.close()
        self._session = None


_UNSAFE_IN_HEADER = re.compile(r"[^\x20-\x7e]")


def header_value(value: str) -> str:
    """`value` as a header can carry it: visible ASCII and spaces, anything else (CR and LF
    above all, which would end the header and start another) replaced by `_`."""
    return _UNSAFE_IN_HEADER.sub("_", value)


def error_message(raw: bytes) -> str:
    """The message in an engine's error body: `{"error": {"message"}}` (SGLang, vLLM),
    `{"message"}` (older vLLM), `{"detail"}` (FastAPI), else the text itself."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text[:1000] or "empty error response"
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str) and err:
            return err
        for key in ("message", "detail"):
            if obj.get(key):
                value = obj[key]
                return value if isinstance(value, str) else json.dumps(value)
    return text[:1000]
