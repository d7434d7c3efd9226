"""A request's body off the socket: the first step of a body's way through `adapter.request`
(read, parse, limit, translate).

`read_body` reads the whole body within its size and time limits (`--max-body-bytes`,
`--body-timeout`), and `decoded_body` decodes one sent with a `Content-Encoding` (gzip or
deflate), never past the size limit.
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import web

from tokentrail.errors import BodyCutShort, RequestError, RequestTimeout, RequestTooLarge

__all__ = ["decoded_body", "read_body"]


async def read_body(request: web.Request, *, max_bytes: int, timeout_s: float) -> bytes:
    """The whole body, refused when its Content-Length is over `max_bytes` (before reading
    it), when it grows past that, or when it does not arrive within `timeout_s` (408: a body
    shorter than its Content-Length would otherwise hold the connection forever). A body
    with a `Content-Encoding` is decoded here (`decoded_body`), in a thread."""
    length = request.content_length
    if max_bytes and length is not None and length > max_bytes:
        raise RequestTooLarge(
            f"request body too large: {length} bytes > {max_bytes} (--max-body-bytes)"
        )
    try:
        raw = await asyncio.wait_for(_read_all(request, max_bytes), timeout_s or None)
    except asyncio.TimeoutError:  # not yet the builtin TimeoutError on 3.10
        expected = f" of the {length} announced" if length is not None else ""
        raise RequestTimeout(
            f"the request body{expected} did not arrive within {timeout_s:g} s (--body-timeout)"
        ) from None
    except BodyCutShort:
        # Nothing more can arrive: the body ends here, so the server does not linger to read
        # (and fail on) the rest of it after the answer.
        request.content.feed_eof()
        raise
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return raw
    return await asyncio.to_thread(decoded_body, raw, encoding, max_bytes)


# A body bigger than this is joined in a worker thread (`bytes.join` lets go of the interpreter
# while it copies): the loop goes on serving meanwhile.
JOIN_OFF_LOOP_BYTES = 1024 * 1024


async def _read_all(request: web.Request, max_bytes: int) -> bytes:
    """The body's chunks as they come, joined once at the end. aiohttp's `read()` grows one
    buffer chunk by chunk and copies it whole at the end, on the loop: tens of milliseconds
    for a 27 MB image request, during which no other connection is served."""
    if request.content.at_eof():
        return await request.read()  # nothing more to come, or read before (a middleware)
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        chunks.append(chunk)
        size += len(chunk)
        if max_bytes and size > max_bytes:
            raise RequestTooLarge(
                f"request body too large: over {max_bytes} bytes (--max-body-bytes)"
            )
    if len(chunks) == 1:
        return chunks[0]
    if size > JOIN_OFF_LOOP_BYTES:
        return await asyncio.to_thread(b"".join, chunks)
    return b"".join(chunks)


# `Content-Encoding` values a body may come in, with their zlib window bits.
_ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decoded_body(raw: bytes, encoding: str, max_bytes: int) -> bytes:
    """`raw` decoded from its `Content-Encoding`, never to more than `max_bytes` (a small
    body that inflates past the limit is refused as a large one is). The server's own HTTP
    layer does not decode bodies: a body that fails to decode there breaks the connection it
    came on; here it is a 400 and the connection carries on."""
    wbits = _ENCODINGS.get(encoding)
    if wbits is None:
        raise RequestError(
            f"unsupported Content-Encoding {encoding!r}; supported: identity, "
            f"{', '.join(_ENCODINGS)}"
        )
    if encoding == "deflate" and raw and raw[0] & 0xF != 8:
        wbits = -zlib.MAX_WBITS  # raw deflate without the zlib header, as some clients send
    decoder = zlib.decompressobj(wbits)
    try:
        out = decoder.decompress(raw, max_bytes + 1 if max_bytes else 0)
    except zlib.error as exc:
        raise RequestError(
            f"the request body is not valid {encoding} (Content-Encoding: {encoding}): {exc}"
        ) from None
    if max_bytes and len(out) > max_bytes:
        raise RequestTooLarge(
            f"request body too large: over {max_bytes} bytes once decoded from {encoding} "
            "(--max-body-bytes)"
        )
    if not decoder.eof:
        raise RequestError(
            f"the request body is not valid {encoding} (Content-Encoding: {encoding}): "
            "it ends before the compressed stream does"
        )
    return out
