"""The engine client's connections (`engines.connection`): an event stream's body handed to the
reader undecoded and its chunk framing taken off by the core, against aiohttp's own parser,
over real sockets from a server that writes exact bytes.

On generated streams (events split across chunks and several in one, trailers, the wire cut
into reads anywhere, the head alone or with the body in one read): the same events as through
aiohttp's parser, and the connection goes back to the pool. Anything but a `200` chunked event
stream with no content coding goes through aiohttp's parser untouched; broken framing and a
connection cut mid-body are named errors of the engine. No turn goes out on a connection the
engine is closing: idle ones are let go before uvicorn's keep-alive closes them.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.engine_thread import engine_in_thread
from tokentrail.engines import connection
from tokentrail.engines.connection import EngineConnection, engine_connector, is_event_stream
from tokentrail.engines.http import HTTPEngine
from tokentrail.engines.streaming import Event, sse_events
from tokentrail.errors import EngineError

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


class WireServer:
    """Answers each request on a connection with the next scripted answer: a list of byte
    pieces, each written and drained apart (a short pause between, so each is its own read)."""

    def __init__(self, answers: list[list[bytes]], pause: float = 0.002) -> None:
        self.answers = answers
        self.pause = pause
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                for piece in self.answers.pop(0):
                    if piece == b"<cut>":
                        writer.transport.abort()
                        return
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(self.pause)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def chunk(data: bytes, extension: bytes = b"") -> bytes:
    return b"%x%s\r\n%s\r\n" % (len(data), extension, data)


def cut(wire: bytes, points: Sequence[int]) -> list[bytes]:
    at = sorted({p for p in points if 0 < p < len(wire)})
    return [wire[a:b] for a, b in zip([0, *at], [*at, len(wire)], strict=True)]


async def read_events(
    url: str, connector: Callable[[], aiohttp.BaseConnector | None], requests: int = 1
) -> tuple[list[list[bytes]], list[bool]]:
    """The events of `requests` streams read one after the other in one session, and whether
    each was handed over undecoded."""
    made = connector()
    got: list[list[bytes]] = []
    raw: list[bool] = []
    async with aiohttp.ClientSession(connector=made) as http:
        for _ in range(requests):
            async with http.post(url + "/generate", json={"stream": True}) as resp:
                protocol = resp.connection.protocol if resp.connection else None
                raw.append(
                    isinstance(protocol, EngineConnection) and protocol.raw_body is resp.content
                )
                events = [bytes(e) async for run in sse_events(resp, 1 << 20) for e in run]
                got.append(events)
    return got, raw


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[bytes], list[bytes]]:
    """Events, and the pieces a server writes them in: each event's line split into chunks
    anywhere (or several events to a chunk), the wire (head included) cut into writes
    anywhere; `[DONE]` in a chunk of its own, written with the last chunk (with trailers or
    not), as SGLang's server writes them back to back (else the reader may be done at
    `[DONE]` before the last chunk arrives, and the connection is dropped, not reused)."""
    events = [
        json.dumps({"i": i, "text": draw(st.text(max_size=30))}).encode()
        for i in range(draw(st.integers(1, 12)))
    ]
    sse = b"".join(b"data: " + e + b"\n\n" for e in events)
    bounds = draw(st.lists(st.integers(1, len(sse) - 1), max_size=8))
    body = b"".join(
        chunk(piece, draw(st.sampled_from([b"", b";x=1"]))) for piece in cut(sse, bounds)
    )
    wire = SSE_HEAD + body
    writes = draw(st.lists(st.integers(1, len(wire) - 1), max_size=6))
    end = chunk(b"data: [DONE]\n\n") + b"0\r\n"
    end += draw(st.sampled_from([b"", b"X-T: 1\r\n"])) + b"\r\n"
    return events, [*cut(wire, writes), end]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.randoms())
def test_a_stream_reads_as_through_aiohttps_parser(
    stream: tuple[list[bytes], list[bytes]], rng: random.Random
) -> None:
    events, pieces = stream
    # Now and then the head and the first chunks in one write.
    if len(pieces) > 1 and rng.random() < 0.3:
        pieces = [pieces[0] + pieces[1], *pieces[2:]]

    async def go(make: Callable[[], aiohttp.BaseConnector | None]) -> tuple[Any, Any, int]:
        server = WireServer([list(pieces), list(pieces)], pause=0.0005)
        async with server as url:
            got, raw = await read_events(url, make, requests=2)
        return got, raw, server.connections

    fast, raw, connections = asyncio.run(go(engine_connector))
    slow, plain, _ = asyncio.run(go(lambda: None))
    assert fast == slow == [events, events]
    assert raw == [True, True] and plain == [False, False]
    # Each body's end was handed to aiohttp: the second request reused the connection.
    assert connections == 1


def test_anything_but_a_chunked_event_stream_goes_through_aiohttps_parser() -> None:
    sse = b"data: {}\n\ndata: [DONE]\n\n"
    gz = gzip.compress(sse)
    answers = [
        # Not chunked: a length.
        [
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
            % len(sse),
            sse,
        ],
        # Compressed.
        [
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            chunk(gz),
            b"0\r\n\r\n",
        ],
        # JSON, chunked.
        [
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked"
            b"\r\n\r\n",
            chunk(b'{"a": '),
            chunk(b"1}"),
            b"0\r\n\r\n",
        ],
    ]

    async def go() -> tuple[list[list[bytes]], list[bool], int]:
        server = WireServer([list(a) for a in answers])
        async with server as url:
            got, raw = await read_events(url, engine_connector, requests=2)
            async with aiohttp.ClientSession(connector=engine_connector()) as http:
                async with http.post(url + "/generate", json={}) as resp:
                    protocol = resp.connection.protocol if resp.connection else None
                    assert isinstance(protocol, EngineConnection)
                    assert protocol.raw_body is None
                    assert await resp.json() == {"a": 1}
        return got, raw, server.connections

    got, raw, _ = asyncio.run(go())
    assert got == [[b"{}"], [b"{}"]]
    assert raw == [False, False]


class Collect:
    """A `RunCapture` that keeps the decoded events."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def take_run(self, events: Sequence[Event], decode: Callable[[Event], Any]) -> None:
        self.events.extend(decode(e) for e in events)


async def stream_through_engine(pieces: list[bytes], capture: Collect) -> None:
    """The engine client's stream of one answer written as `pieces`, into `capture`."""
    async with WireServer([pieces]) as url:
        engine = HTTPEngine(url)
        try:
            await engine._request_stream("/generate", {}, {}, 1 << 20, capture)
        finally:
            await engine.close()


def test_an_error_status_is_read_by_aiohttp_and_named() -> None:
    body = json.dumps({"error": {"message": "bad things"}}).encode()
    answer = [
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunk(body) + b"0\r\n\r\n"
    ]

    with pytest.raises(EngineError, match="bad things"):
        asyncio.run(stream_through_engine(answer, Collect()))


@pytest.mark.parametrize(
    ("pieces", "why"),
    [
        ([SSE_HEAD, b"7\r\ndata: 1\n\nXX"], "streamed a broken body: a chunk's data is not"),
        ([SSE_HEAD, chunk(b"data: 1\n\n"), b"zz\r\n"], "a chunk size is not a hex number"),
        ([SSE_HEAD, chunk(b"data: 1\n\n"), b"<cut>"], "payload is not completed"),
        ([SSE_HEAD, chunk(b"data: 1\n\n") + b"9\r\nda", b"<cut>"], "payload is not completed"),
    ],
)
def test_broken_framing_and_a_cut_body_are_the_engines_errors(
    pieces: list[bytes], why: str
) -> None:
    capture = Collect()

    with pytest.raises(EngineError, match=why):
        asyncio.run(stream_through_engine(pieces, capture))
    assert capture.events[:1] in ([], [1])  # what came before the fault, if anything


def test_the_engine_clients_connections_are_engine_connections() -> None:
    async def go() -> bool:
        engine = HTTPEngine("http://127.0.0.1:1")
        try:
            factory = engine._client().connector._factory  # type: ignore[union-attr]
            return isinstance(factory(), EngineConnection)
        finally:
            await engine.close()

    # The aiohttp installed is the one `EngineConnection` was written against.
    assert connection.TAKES_OVER
    assert asyncio.run(go())


def head_of(status: bytes, *fields: bytes) -> bytes:
    return b"\r\n".join([status, *fields]) + b"\r\n\r\n"


OK = b"HTTP/1.1 200 OK"
SSE, CHUNKED = b"Content-Type: text/event-stream", b"Transfer-Encoding: chunked"


@pytest.mark.parametrize(
    ("head", "taken"),
    [
        (SSE_HEAD, True),
        (head_of(OK, b"content-type: TEXT/EVENT-STREAM", b"transfer-encoding: Chunked"), True),
        (head_of(b"HTTP/1.1 201 Created", SSE, CHUNKED), False),
        (head_of(b"HTTP/1.0 200 OK", SSE, CHUNKED), False),
        (head_of(OK, SSE, b"Transfer-Encoding: gzip, chunked"), False),
        (head_of(OK, SSE, CHUNKED, CHUNKED), False),
        (head_of(OK, b"Content-Type: text/event-streams", CHUNKED), False),
        (head_of(OK, SSE, CHUNKED, b"Content-Encoding: br"), False),
        (head_of(OK, SSE, CHUNKED, b"Content-Encoding: identity"), True),
        (head_of(OK, SSE, CHUNKED, b"Content-Length: 5"), False),
        (head_of(OK, CHUNKED), False),
    ],
)
def test_which_heads_are_event_streams(head: bytes, taken: bool) -> None:
    assert is_event_stream(head) is taken


def test_the_suites_check_names_a_core_that_reads_a_body_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tokentrail.core.backend import load_backend
    from tokentrail.engines import streaming

    monkeypatch.setattr(streaming, "VERIFY_CHUNKS", True)
    monkeypatch.setattr(load_backend("python"), "http_chunks", lambda buf, left: (b"", 0, 0, 0))
    pieces = [SSE_HEAD, chunk(b"data: 1\n\n") + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"]

    with pytest.raises(EngineError, match="is not the reference's"):
        asyncio.run(stream_through_engine(pieces, Collect()))


# --- keep-alive ----------------------------------------------------------------------------

# uvicorn's default keep-alive, which vLLM and SGLang serve with: an idle connection is closed
# this long after its last answer.
SERVER_KEEPALIVE_S = 5.0


class ClosingIdleConnections:
    """A server that answers `POST /g` and closes a connection `SERVER_KEEPALIVE_S` after its
    last answer; run in a thread of its own (`engine_in_thread`), so that its closes go out
    while the test's loop is busy."""

    url = ""

    async def __aenter__(self) -> ClosingIdleConnections:
        async def answer(_: web.Request) -> web.Response:
            return web.json_response({"ok": True})

        app = web.Application()
        app.router.add_post("/g", answer)
        self.runner = web.AppRunner(app, keepalive_timeout=SERVER_KEEPALIVE_S, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


@pytest.mark.parametrize("client", ["engine", "aiohttp-default"])
def test_no_request_goes_out_on_a_connection_the_engine_is_closing(client: str) -> None:
    """A turn after an idle spell just over the server's keep-alive, the loop busy (other
    turns) while the server's close arrives: the engine client has let the connection go and
    opens a new one; aiohttp's default connector (15 s) sends the turn on the closed one, and
    it fails, as a turn did in a closed RL loop against vLLM."""

    async def go(url: str) -> Any:
        engine = HTTPEngine(url)
        async with aiohttp.ClientSession() as http:

            async def turn() -> Any:
                if client == "engine":
                    return await engine._request_json("POST", "/g", {})
                async with http.post(f"{url}/g", json={}) as resp:
                    return await resp.json()

            try:
                await turn()
                await asyncio.sleep(SERVER_KEEPALIVE_S - 1.0)
                time.sleep(1.5)  # the server closes the connection meanwhile, unread here
                return await turn()
            finally:
                await engine.close()

    assert connection.ENGINE_KEEPALIVE_S < SERVER_KEEPALIVE_S
    with engine_in_thread(ClosingIdleConnections()) as server:
        if client == "engine":
            assert asyncio.run(go(server.url)) == {"ok": True}
        else:
            with pytest.raises(aiohttp.ClientError):
                asyncio.run(go(server.url))
