"""Reference of `rust/http_chunks.rs`: the body of an HTTP/1.1 response in chunked transfer
coding, taken off its framing a read at a time (a read may end anywhere; a size line or the
trailer section it ends in is left for the next)."""

from __future__ import annotations

import re

from tokentrail.errors import ChunkedBodyError

__all__ = ["MAX_LINE", "http_chunks"]

MAX_LINE = 8190
_SIZE = re.compile(rb"([0-9a-fA-F]+)[ \t]*(;.*)?", re.DOTALL)


def http_chunks(buf: bytes, left: int) -> tuple[bytes, int, int, bool]:
    """`(body, end, left, last)` of the read `buf`, `left` bytes into the current chunk (its
    data and CRLF still to come; 0 at a size line). Raises `ChunkedBodyError` for broken
    framing."""
    body: list[bytes] = []
    pos, n = 0, len(buf)
    while True:
        if left > 2:
            take = min(left - 2, n - pos)
            body.append(buf[pos : pos + take])
            pos, left = pos + take, left - take
        while left and pos < n:
            if buf[pos] != (13 if left == 2 else 10):
                raise ChunkedBodyError("a chunk's data is not followed by CRLF")
            pos, left = pos + 1, left - 1
        if left or pos == n:
            break
        line_end = buf.find(b"\n", pos)
        if line_end < 0:
            if n - pos > MAX_LINE:
                raise ChunkedBodyError("a chunk size line is too long")
            break
        size = _chunk_size(buf[pos:line_end])
        if size:
            pos, left = line_end + 1, size + 2
            continue
        at = line_end + 1
        while True:
            end = buf.find(b"\n", at)
            if end < 0:
                if n - pos > MAX_LINE:
                    raise ChunkedBodyError("the trailer section is too long")
                return b"".join(body), pos, 0, False
            if not buf.endswith(b"\r", at, end):
                raise ChunkedBodyError("a trailer line does not end with CRLF")
            blank, at = end == at + 1, end + 1
            if blank:
                return b"".join(body), at, 0, True
            if at - pos > MAX_LINE:
                raise ChunkedBodyError("the trailer section is too long")
    return b"".join(body), pos, left, False


def _chunk_size(line: bytes) -> int:
    if not line.endswith(b"\r"):
        raise ChunkedBodyError("a chunk size line does not end with CRLF")
    line = line[:-1]
    if len(line) > MAX_LINE:
        raise ChunkedBodyError("a chunk size line is too long")
    match = _SIZE.fullmatch(line)
    if match is None:
        raise ChunkedBodyError("a chunk size is not a hex number")
    size = int(match[1], 16)
    if size >= 2**64 - 2:
        raise ChunkedBodyError("a chunk size is too large")
    return size
