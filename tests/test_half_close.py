"""A request followed by a half-close (`shutdown(SHUT_WR)`, as `nc -N` does) is answered over
a real socket; a body cut short by it is a 400 at once; a client that closes entirely while its
turn runs still abandons the turn, unrecorded."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.engines.scripted import ScriptedEngine

ADMIN = "half-close-admin"
BODY = json.dumps(
    {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
).encode()


class GatedEngine(ScriptedEngine):
    """The scripted engine; `gate` holds every call until it is set."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.gate: asyncio.Event | None = None
        self.calls = self.answered = 0

    async def generate(self, req):
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        self.answered += 1
        return await super().generate(req)


def request(
    sid: str, body: bytes = BODY, *, version: str = "1.1", length: int | None = None
) -> bytes:
    head = (
        f"POST /v1/messages HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {sid}\r\nContent-Length: {len(body) if length is None else length}"
        "\r\n\r\n"
    )
    return head.encode() + body


def responses(raw: bytes) -> list[tuple[int, bytes]]:
    """The (status, body) of each final response in `raw`; 1xx interim ones are skipped."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n")
             if line.lower().startswith(b"content-length:")),
            0,
        )  # fmt: skip
        if status >= 200:
            out.append((status, rest[:length]))
        raw = rest[length:]
    return out


async def half_closed(url: str, payload: bytes) -> bytes:
    """Send `payload`, shut the sending side, read until the server closes."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(payload)
    await writer.drain()
    writer.write_eof()  # shutdown(SHUT_WR)
    try:
        return await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()


def served(tokenizer, body) -> tuple[Adapter, Any]:
    adapter = Adapter(
        engine=GatedEngine(tokenizer),
        tokenizer=tokenizer,
        config=AdapterConfig(admin_token=ADMIN),
    )

    async def main():
        runner, url = await start_server(adapter)
        try:
            return await body(adapter, url)
        finally:
            await runner.cleanup()

    return adapter, asyncio.run(main())


def turns_of(adapter: Adapter, sid: str) -> int:
    return len(asyncio.run(adapter.finish_trajectory(sid)).ledger.turns)


def test_a_half_closed_request_is_answered_and_recorded(tokenizer) -> None:
    async def body(adapter, url):
        return await half_closed(url, request("nc-1")), await half_closed(
            url, request("nc-2", version="1.0")
        )

    adapter, (eleven, ten) = served(tokenizer, body)
    for raw in (eleven, ten):
        [(status, reply)] = responses(raw)
        assert status == 200, raw
        assert json.loads(reply)["type"] == "message"
    assert eleven.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200")
    assert not ten.startswith(b"HTTP/1.1 100")  # no interim answer for an HTTP/1.0 client
    assert turns_of(adapter, "nc-1") == turns_of(adapter, "nc-2") == 1


def test_a_half_closed_streamed_request_gets_its_whole_stream(tokenizer) -> None:
    streamed = json.dumps({**json.loads(BODY), "stream": True}).encode()

    async def body(adapter, url):
        return await half_closed(url, request("nc-stream", streamed))

    adapter, raw = served(tokenizer, body)
    interim, _, rest = raw.partition(b"\r\n\r\n")
    assert interim == b"HTTP/1.1 100 Continue"
    head, _, stream = rest.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
    assert b"100 Continue" not in stream and b"event: message_stop" in stream
    assert turns_of(adapter, "nc-stream") == 1


def test_pipelined_requests_before_a_half_close_are_all_answered(tokenizer) -> None:
    async def body(adapter, url):
        return await half_closed(url, request("pipe") + request("pipe"))

    adapter, raw = served(tokenizer, body)
    assert [status for status, _ in responses(raw)] == [200, 200]


def test_a_body_cut_short_by_a_half_close_is_a_400_at_once(tokenizer) -> None:
    async def body(adapter, url):
        started = time.monotonic()
        raw = await half_closed(url, request("cut", BODY[:20], length=len(BODY)))
        return raw, time.monotonic() - started

    adapter, (raw, took) = served(tokenizer, body)
    [(status, reply)] = responses(raw)
    assert status == 400
    message = json.loads(reply)["error"]["message"]
    assert f"ended after 20 bytes of the {len(BODY)}" in message
    assert took < adapter.limits.body_timeout_s  # not the body timeout's 408
    assert adapter.engine.calls == 0


def test_a_client_gone_entirely_still_abandons_its_turn(tokenizer) -> None:
    async def body(adapter, url):
        adapter.engine.gate = asyncio.Event()
        host, port = url.removeprefix("http://").split(":")
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(request("gone"))
        while adapter.engine.calls < 1:
            await asyncio.sleep(0.01)
        writer.close()  # a full close: the FIN looks like a half-close, the reset tells
        for _ in range(500):
            if not adapter.connections:
                break
            await asyncio.sleep(0.01)
        adapter.engine.gate.set()
        await asyncio.sleep(0.05)

    adapter, _ = served(tokenizer, body)
    assert not adapter.connections  # the server saw the reset and closed the connection
    assert (
        adapter.engine.calls == 1 and adapter.engine.answered == 0
    )  # the engine call was cancelled
    session = adapter.sessions.get("gone")
    assert session is None or turns_of(adapter, "gone") == 0


def tracebacks(caplog) -> list[str]:
    """Log records that carry a traceback, and "exception was never retrieved" lines."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.exc_info or r.exc_text or "never retrieved" in r.getMessage()
    ]


def test_a_body_cut_short_by_a_half_close_logs_no_traceback(tokenizer, caplog) -> None:
    async def body(adapter, url):
        raw = await half_closed(url, request("cut", BODY[:20], length=len(BODY)))
        await asyncio.sleep(0.2)  # what the server logs after the answer, it has logged
        return raw

    with caplog.at_level("DEBUG"):
        _, raw = served(tokenizer, body)
    [(status, _)] = responses(raw)
    assert status == 400
    assert tracebacks(caplog) == []


async def on_one_connection(url: str, *payloads: bytes) -> bytes:
    """Send each request on one keep-alive connection, reading its answer before the next."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    out = b""
    try:
        for payload in payloads:
            writer.write(payload)
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            out += head + await asyncio.wait_for(reader.readexactly(length), 30)
    finally:
        writer.close()
    return out


def gzipped(sid: str, body: bytes) -> bytes:
    return request(sid, body).replace(
        b"Content-Type:", b"Content-Encoding: gzip\r\nContent-Type:", 1
    )


def test_a_body_that_is_not_the_gzip_it_says_is_a_400_and_the_connection_lives_on(
    tokenizer, caplog
) -> None:
    """`Content-Encoding: gzip` over bytes that are not gzip: a 400 in the protocol's shape,
    nothing logged as a fault, and the next request on the same connection is answered; a body
    that is gzip is read as its JSON, and one that inflates past the body limit is a 413."""
    import gzip

    async def body(adapter, url):
        raw = await on_one_connection(
            url,
            gzipped("gz", b"not gzip"),
            gzipped("gz", gzip.compress(BODY)),
            request("gz"),
            # A small body that inflates past --max-body-bytes is refused as a large one is.
            gzipped("gz", gzip.compress(b" " * (adapter.limits.max_body_bytes + 1))),
        )
        await asyncio.sleep(0.2)
        return raw

    with caplog.at_level("DEBUG"):
        adapter, raw = served(tokenizer, body)
    (bad, bad_reply), (good, _), (plain, _), (bomb, _) = responses(raw)
    assert bomb == 413
    assert bad == 400
    error = json.loads(bad_reply)
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "gzip" in error["error"]["message"]
    assert (good, plain) == (200, 200)
    assert tracebacks(caplog) == []
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
