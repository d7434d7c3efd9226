"""A reply written whole, once its turn is done (not streamed as sampled): its bytes (SSE
frames or JSON) built in a worker, since a long stream is thousands of frames, then written
within a time limit, since a client that reads none of it must not hold its connection and
buffers forever."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from tokentrail.adapter.offload import Offload
from tokentrail.adapter.protocols import WireProtocol
from tokentrail.adapter.request.reader import TurnRequest

__all__ = ["reply_bytes", "send_whole", "write_reply"]


def reply_bytes(
    proto: WireProtocol, reply: dict[str, Any], stream: bool, body: dict[str, Any]
) -> bytes:
    """A whole reply's bytes: its SSE frames, or its JSON."""
    if stream:
        return b"".join(proto.stream(reply, body))
    return json.dumps(reply, ensure_ascii=False).encode()


async def write_reply(
    request: web.Request,
    proto: WireProtocol,
    reply: dict[str, Any],
    stream: bool,
    body: dict[str, Any],
    *,
    payload: bytes | None = None,
    timeout_s: float = 0.0,
) -> web.StreamResponse:
    """Write the whole response (`payload`: its bytes, built already) and flush it; raises if
    the client went away first, or read none of it for `timeout_s` (0: no limit)."""
    if payload is None:
        payload = reply_bytes(proto, reply, stream, body)
    if stream:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
    else:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(payload)
    await response.prepare(request)
    try:
        # The bytes go to the socket's buffer at once; the wait is for the client to read
        # enough of them. One that does not is cut off, its connection closed.
        await asyncio.wait_for(response.write(payload), timeout_s or None)
        await asyncio.wait_for(response.write_eof(), timeout_s or None)
    except asyncio.TimeoutError:
        if request.transport is not None:
            request.transport.abort()
        raise ConnectionResetError(
            f"the client read none of its reply for {timeout_s:g} s (--idle-connection-timeout)"
        ) from None
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("client disconnected before the response was flushed")
    return response


async def send_whole(
    request: web.Request,
    proto: WireProtocol,
    reply: dict[str, Any],
    turn: TurnRequest,
    *,
    offload: Offload,
    timeout_s: float,
) -> web.StreamResponse:
    """`reply` to `turn`'s request, its bytes built in a worker, written within `timeout_s`."""
    payload = await offload.run(reply_bytes, proto, reply, turn.stream, turn.body)
    return await write_reply(
        request, proto, reply, turn.stream, turn.body, payload=payload, timeout_s=timeout_s
    )
