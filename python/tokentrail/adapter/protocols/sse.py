"""The pace of a streamed reply: a written-whole reply's text goes out in deltas of
`STREAM_CHUNK` characters (`pieces`), and a live one sends something at least every
`KEEPALIVE_S` seconds."""

from __future__ import annotations

__all__ = ["KEEPALIVE_S", "STREAM_CHUNK", "pieces"]


# How many characters one streamed delta carries.
STREAM_CHUNK = 64


# A harness hears this often from a stream, at least, while the engine queues, prefills or
# stalls: proxies and harness idle timeouts are 60 s and more (Codex's stream idle timeout is
# 300 s), and an Anthropic stream pings about this often.
KEEPALIVE_S = 15.0


def pieces(text: str, size: int = STREAM_CHUNK) -> list[str]:
    """`text` in deltas of `size` characters; none for empty text."""
    return [text[i : i + size] for i in range(0, len(text), size)]
