"""HTTP plumbing shared by the SGLang and vLLM clients: one `aiohttp.ClientSession` per event
loop, JSON in and out, every failure an `EngineError` carrying the engine's own message and URL.

An answer is read to its end however it arrives (one write, many small chunks, chunked transfer
encoding, trickled), and never past the bound the request sets (`engines.bound`): a longer one
is refused and its connection dropped, which also stops the request in vLLM.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import msgspec

from tokentrail.engines.base import (
    REQUEST_ID_HEADER,
    ROUTING_HEADER,
    SESSION_HEADER,
    GenerateRequest,
)
from tokentrail.engines.connection import engine_connector
from tokentrail.engines.streaming import (
    COALESCE_MAX_S,
    COALESCE_S,
    Event,
    EventTooLong,
    RunCapture,
    sse_events,
)
from tokentrail.engines.wire_json import loads_in_pieces
from tokentrail.engines.wire_rows import lift_base64
from tokentrail.errors import (
    ChunkedBodyError,
    EngineError,
    EngineOutputError,
    EngineSpecError,
    engine_error,
)
from tokentrail.kinds import EngineFault

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Streamed events: msgspec reads numbers and strings as the standard library does, several
# times faster (a streamed turn reads one event per token).
_EVENT = msgspec.json.Decoder()

# An engine that does not take the connection within this long is unreachable: the harness
# should hear so now, not after the generation timeout.
CONNECT_TIMEOUT_S = 10.0
# An error answer (non-2xx) is read up to this much; its message is what matters.
ERROR_BODY_BYTES = 1024 * 1024


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


# Answers past this size are decoded, and read into a `Generation`, in a worker thread: the
# loop serves every other connection meanwhile.
OFF_LOOP_BYTES = 256 * 1024
OFF_LOOP_TOKENS = 4096


def _as_is(data: Any, lifted: dict[str, memoryview]) -> tuple[Any, dict[str, memoryview]]:
    return data, lifted


def _json_of(raw: bytes | bytearray | None) -> Any:
    return json.loads(raw.decode("utf-8") if raw is not None else "")


def parse_off_loop(req: GenerateRequest, lifted: Mapping[str, Any] | None = None) -> bool:
    """Whether an answer to `req` is read into a `Generation` in a worker: replay rows, or a
    turn that may be long (a parse walks every token's id and logprob)."""
    return bool(lifted) or req.sampling.max_new_tokens > OFF_LOOP_TOKENS


class HTTPEngine:
    """One `aiohttp.ClientSession` per event loop, JSON in and out, errors as `EngineError`."""

    name = "http"

    def __init__(self, base_url: str, *, timeout: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.connect_timeout = CONNECT_TIMEOUT_S
        # How long a stream's socket is left unread after its first run, and at most after any
        # (`streaming.COALESCE_S`, `COALESCE_MAX_S`).
        self.stream_coalesce_s = COALESCE_S
        self.stream_coalesce_max_s = COALESCE_MAX_S
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Strong references to fire-and-forget aborts, so they are not collected mid-flight.
        self._background: set[asyncio.Task[None]] = set()

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        # A session belongs to the loop it was made in; a new loop (each `asyncio.run`) needs
        # its own. The old one cannot be closed from here and is dropped.
        if self._session is None or self._session.closed or self._loop is not loop:
            self._session = aiohttp.ClientSession(
                connector=engine_connector(), timeout=self._timeout(self.timeout)
            )
            self._loop = loop
        return self._session

    def _timeout(self, total: float) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=total, sock_connect=min(total, self.connect_timeout))

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
    ) -> Any:
        """The JSON answer of one call."""
        data, _ = await self._request_answer(method, path, body, headers, timeout)
        return data

    async def _request_answer(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_bytes: int | None = None,
        lift: bool = False,
    ) -> tuple[Any, dict[str, memoryview]]:
        """The JSON answer of one call; `max_bytes` bounds the answer read (a generation's
        answer cannot be bigger than its request makes it: `engines.bound.answer_limit`).
        With `lift`, the replay rows' base64 comes back apart (`wire_rows.lift_base64`): by
        the placeholder that stands in for it in the answer, views of the answer's bytes."""
        return await self._request_read(
            method, path, _as_is, body, headers, timeout, max_bytes, lift
        )

    async def _request_read(
        self,
        method: str,
        path: str,
        read: Callable[[Any, dict[str, memoryview]], T],
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_bytes: int | None = None,
        lift: bool = False,
        off_loop: bool = False,
    ) -> T:
        """`read(answer, lifted)` of one call's JSON answer (`_request_answer`). A large answer,
        or any with `off_loop`, is decoded and read in one worker call: the decoded tree (one
        object per token) is made and freed there, never on the loop."""
        url = self.base_url + path
        kwargs: dict[str, Any] = {"headers": dict(headers or {})}
        if body is not None:
            kwargs["json"] = body
        if timeout is not None:
            kwargs["timeout"] = self._timeout(timeout)
        try:
            async with self._client().request(method, url, **kwargs) as resp:
                status = resp.status
                ok = 200 <= status < 300
                raw = await read_bounded(resp, max_bytes if ok else ERROR_BODY_BYTES)
                if raw is None and ok:
                    resp.close()  # unread: drop the connection (vLLM aborts the request on it)
                    raise EngineOutputError(
                        EngineFault.TOO_LONG,
                        f"{self.name} at {url} answered with more than {max_bytes} bytes, "
                        "more than the request can take (tokens and replay rows asked for)",
                    )
        except aiohttp.ConnectionTimeoutError:
            raise EngineError(
                f"cannot reach {self.name} at {url}: no connection within "
                f"{self.connect_timeout:g} s"
            ) from None
        except asyncio.TimeoutError:  # aiohttp's timeout; not yet the builtin one on 3.10
            raise EngineError(
                f"{self.name} at {url} did not answer within {timeout or self.timeout:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise EngineError(f"cannot reach {self.name} at {url}: {exc}") from None
        if not ok:
            message = error_message(raw) if raw is not None else "error answer too long"
            raise engine_error(f"{self.name} at {url}: {message}", status)
        lifted: dict[str, memoryview] = {}
        if lift and raw is not None:
            raw, lifted = lift_base64(raw)

        def decode_and_read(raw: bytes | bytearray | None) -> T:
            try:
                # A long turn's answer (ids and logprobs) is decoded a piece at a time, so the
                # loop gets the interpreter back in between.
                data = loads_in_pieces(raw) if raw is not None and big else _json_of(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise EngineError(
                    f"{self.name} at {url} answered with invalid JSON", status
                ) from None
            return read(data, lifted)

        big = raw is not None and len(raw) > OFF_LOOP_BYTES
        if big or off_loop:
            return await asyncio.to_thread(decode_and_read, raw)
        return decode_and_read(raw)

    async def _request_stream(
        self,
        path: str,
        body: Any,
        headers: Mapping[str, str],
        max_event_bytes: int,
        capture: RunCapture,
    ) -> None:
        """POST `body` and hand the streamed answer's events to `capture`, a run at a time
        (the events that arrived together), in order, until `[DONE]` or the end. An event
        `{"error": {...}}` (an engine failing after its 200) and an event over
        `max_event_bytes` end the stream as `EngineError`s."""
        url = self.base_url + path

        def decode(event: Event) -> Any:
            return self._event_json(url, event)

        try:
            async with self._client().post(url, json=body, headers=dict(headers)) as resp:
                status = resp.status
                if not 200 <= status < 300:
                    raw = await read_bounded(resp, ERROR_BODY_BYTES)
                    message = error_message(raw) if raw is not None else "error answer too long"
                    raise engine_error(f"{self.name} at {url}: {message}", status)
                first = True
                try:
                    runs = sse_events(
                        resp, max_event_bytes, self.stream_coalesce_s, self.stream_coalesce_max_s
                    )
                    async for run in runs:
                        if first:
                            # The first event alone, then let what it woke (a streamed reply's
                            # writer) run before the events that arrived with it are taken:
                            # else the harness hears the first token only after all of them.
                            first = False
                            capture.take_run(run[:1], decode)
                            await asyncio.sleep(0)
                            run = run[1:]
                        if run:
                            capture.take_run(run, decode)
                except EventTooLong:
                    resp.close()  # drop the connection (vLLM aborts the request on it)
                    raise EngineOutputError(
                        EngineFault.TOO_LONG,
                        f"{self.name} at {url} streamed an event of more than "
                        f"{max_event_bytes} bytes, more than the request can take",
                    ) from None
                except ChunkedBodyError as exc:
                    resp.close()
                    raise EngineError(
                        f"{self.name} at {url} streamed a broken body: {exc}"
                    ) from None
        except aiohttp.ConnectionTimeoutError:
            raise EngineError(
                f"cannot reach {self.name} at {url}: no connection within "
                f"{self.connect_timeout:g} s"
            ) from None
        except TimeoutError:
            raise EngineError(
                f"{self.name} at {url} did not answer within {self.timeout:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise EngineError(f"cannot reach {self.name} at {url}: {exc}") from None

    def _event_json(self, url: str, event: Event) -> Any:
        """A streamed event's JSON; an `{"error": ...}` event or one that is not JSON is an
        `EngineError`."""
        try:
            obj = _EVENT.decode(event)
        except msgspec.DecodeError:
            try:
                # What msgspec refuses and the standard library reads (NaN, Infinity).
                obj = json.loads(bytes(event))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise EngineError(
                    f"{self.name} at {url} streamed an event that is not JSON"
                ) from None
        if isinstance(obj, dict) and "error" in obj:
            raise engine_error(
                f"{self.name} at {url}: {error_message(bytes(event))}", _status_of(obj["error"])
            )
        return obj

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


async def read_bounded(
    resp: aiohttp.ClientResponse, max_bytes: int | None
) -> bytes | bytearray | None:
    """The whole body of `resp`, read chunk by chunk to its end; None as soon as it is longer
    than `max_bytes` (a declared `Content-Length` over it is refused before reading)."""
    if max_bytes is None:
        return await resp.read()
    declared = resp.content_length
    if declared is not None and declared > max_bytes:
        return None
    body = bytearray()
    async for chunk in resp.content.iter_any():
        if len(body) + len(chunk) > max_bytes:
            return None
        body += chunk
    return body


def _status_of(error: Any) -> int | None:
    """The HTTP status an in-stream error names (`code` in vLLM's, `status_code` in some)."""
    if isinstance(error, dict):
        for key in ("code", "status_code"):
            value = error.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and 400 <= value < 600:
                return value
    return None


_UNSAFE_IN_HEADER = re.compile(r"[^\x20-\x7e]")


def header_value(value: str) -> str:
    """`value` as a header can carry it: visible ASCII and spaces, anything else (CR and LF
    above all, which would end the header and start another) replaced by `_`."""
    return _UNSAFE_IN_HEADER.sub("_", value)


def error_message(raw: bytes | bytearray) -> str:
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
