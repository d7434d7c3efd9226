"""The pace of a streamed reply: a written-whole reply's text goes out in deltas of
`STREAM_CHUNK` characters (`pieces`), and a live one sends something at least every
`KEEPALIVE_S` seconds. `text_frames` writes a long reply's thousands of delta frames."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from json.encoder import encode_basestring

__all__ = ["KEEPALIVE_S", "STREAM_CHUNK", "pieces", "text_frames"]


# How many characters one streamed delta carries.
STREAM_CHUNK = 64


# A harness hears this often from a stream, at least, while the engine queues, prefills or
# stalls: proxies and harness idle timeouts are 60 s and more (Codex's stream idle timeout is
# 300 s), and an Anthropic stream pings about this often.
KEEPALIVE_S = 15.0


def pieces(text: str, size: int = STREAM_CHUNK) -> list[str]:
    """`text` in deltas of `size` characters; none for empty text."""
    return [text[i : i + size] for i in range(0, len(text), size)]


# Stands for a delta's text while its frame is made once: with a character of each kind the
# encoder escapes or not (a control, a quote, a backslash, non-ASCII), so a frame written with
# other escapes (`ensure_ascii=True`) does not hold it and is made for each text.
_MARK = '\0"\\\u00e9\u2028 tokentrail delta'

# Frames joined into one piece of bytes.
_FRAMES_PER_PIECE = 1024


def text_frames(frame: Callable[[str], bytes], texts: Sequence[str]) -> Iterator[bytes]:
    """The bytes of `frame(t)` for each of `texts`, for a `frame` that writes its text once, as
    `json.dumps(..., ensure_ascii=False)` writes a string. The frame is made once, around a
    mark, and each text is escaped by the encoder `json.dumps` uses: a 700 KB reply is ten
    thousand frames, and a `json.dumps` of a dict each held the interpreter (the event loop
    waiting for it) three times as long. A frame the mark is not found in once is made for
    each text."""
    if len(texts) < 2:
        yield from map(frame, texts)
        return
    mark = encode_basestring(_MARK)
    head, found, tail = frame(_MARK).decode().partition(mark)
    if not found or mark in tail:
        yield from map(frame, texts)
        return
    for at in range(0, len(texts), _FRAMES_PER_PIECE):
        part = texts[at : at + _FRAMES_PER_PIECE]
        yield "".join([head + encode_basestring(t) + tail for t in part]).encode()
