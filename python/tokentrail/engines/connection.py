"""The engine client's connections: aiohttp's, except that the body of an event stream reaches
the response's reader as it arrives, chunk framing and all, in one call a read (the reader takes
the framing off in the core: `core.http_chunks`).

aiohttp's parser hands a chunked body over an HTTP chunk at a time, three Python calls a chunk
(its start, its data, its end), and an engine sends one chunk an event: at an event a token,
that was the largest part of what reading a stream cost. A response is taken this way where it
is a `200` with `Transfer-Encoding: chunked`, `Content-Type: text/event-stream` and no content
coding; any other goes through aiohttp's parser as before. aiohttp still reads the head, and is
handed the last chunk once the reader has found it, so the response ends and the connection
goes back to the pool as it would have; a connection lost mid-body fails the reader as it
always has (aiohttp's parser, still in the body, finds it incomplete).

An idle connection is reused for `ENGINE_KEEPALIVE_S` at most, under the 5 s after which
uvicorn (vLLM's and SGLang's server, at its default) closes one: aiohttp's own 15 s let a
request go out on a connection the engine had just closed, whose close the loop, busy with
other turns, had not read yet, and the turn failed (`Connection reset by peer`, `Server
disconnected`: a 502 to the harness) after an idle spell of about 5 s, as between an agent's
turns while a tool runs.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler

__all__ = ["ENGINE_KEEPALIVE_S", "EngineConnection", "engine_connector"]

# How long an idle connection to the engine is kept for reuse: under uvicorn's default
# keep-alive (5 s), after which the engine closes it.
ENGINE_KEEPALIVE_S = 4.0
# A response head longer than this is left to aiohttp (which refuses it).
MAX_HEAD_BYTES = 64 * 1024
HEAD_END = b"\r\n\r\n"
# What aiohttp's parser is handed for the body's end the reader found.
LAST_CHUNK = b"0\r\n\r\n"


class EngineConnection(ResponseHandler):
    """aiohttp's connection protocol, with an event stream's body fed to the response's reader
    undecoded (`raw_body` is that reader while it is)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.raw_body: aiohttp.StreamReader | None = None
        self._head = bytearray()  # the head of the response being read, so far
        self._heading = False  # whether the bytes that come are still the head's

    def set_response_params(self, **kwargs: Any) -> None:
        """A new request on this connection: its answer starts with a head."""
        self.raw_body, self._heading = None, True
        self._head.clear()
        super().set_response_params(**kwargs)

    def data_received(self, data: bytes) -> None:
        raw = self.raw_body
        if raw is not None:
            if data:
                self._reschedule_timeout()
                raw.feed_data(data)
            return
        if not self._heading:
            super().data_received(data)
            return
        seen = len(self._head)
        self._head += data
        end = self._head.find(HEAD_END, max(0, seen - len(HEAD_END) + 1))
        if end < 0:
            if len(self._head) > MAX_HEAD_BYTES:
                self._heading = False
                self._head.clear()
            super().data_received(data)
            return
        cut = end + len(HEAD_END) - seen
        head = bytes(self._head[: end + len(HEAD_END)])
        self._heading = False
        self._head.clear()
        super().data_received(data[:cut])
        payload = self._payload
        if (
            type(payload) is aiohttp.StreamReader
            and not self._skip_payload
            and not payload.is_eof()
            and payload.exception() is None
            and is_event_stream(head)
        ):
            payload.begin_http_chunk_receiving()  # as aiohttp's parser does at a first chunk
            self.raw_body = payload
            self.data_received(data[cut:])
        elif cut < len(data):
            super().data_received(data[cut:])

    def end_raw_body(self, after: bytes) -> None:
        """The reader found the body's last chunk: aiohttp's parser is handed one (the response
        ends there, as it would have), then `after`, what followed it."""
        self.raw_body = None
        super().data_received(LAST_CHUNK + after)


def is_event_stream(head: bytes) -> bool:
    """Whether a response head is a `200` event stream in chunked transfer coding, with no
    content coding and no length."""
    lines = head.split(b"\r\n")
    status = lines[0].split(b" ", 2)
    if len(status) < 2 or status[0] != b"HTTP/1.1" or status[1] != b"200":
        return False
    codings, stream = [], False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            continue
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"transfer-encoding":
            codings.append(value)
        elif name == b"content-type":
            stream = value.split(b";", 1)[0].strip() == b"text/event-stream"
        elif name == b"content-length" or (
            name == b"content-encoding" and value not in (b"", b"identity")
        ):
            return False
    return stream and codings == [b"chunked"]


# What `EngineConnection` takes from aiohttp, looked for once (without them all, the engine
# client's connections are aiohttp's own; a test holds the installed aiohttp to having them).
TAKES_OVER = all(
    hasattr(ResponseHandler, name)
    for name in ("_reschedule_timeout", "set_response_params", "data_received")
) and all(
    hasattr(aiohttp.StreamReader, name)
    for name in ("begin_http_chunk_receiving", "feed_data", "is_eof", "exception")
)


def engine_connector() -> aiohttp.TCPConnector:
    """A connector whose connections are `EngineConnection`s (aiohttp's own where the installed
    aiohttp is not the one this was written against), idle ones kept `ENGINE_KEEPALIVE_S`."""
    connector = aiohttp.TCPConnector(keepalive_timeout=ENGINE_KEEPALIVE_S)
    if TAKES_OVER and hasattr(connector, "_factory"):
        connector._factory = functools.partial(_connection, asyncio.get_running_loop())
    return connector


def _connection(loop: asyncio.AbstractEventLoop) -> ResponseHandler:
    return EngineConnection(loop)
