"""Engine streaming: an engine's answer read as server-sent events while it samples, each new
token id and its logprob handed to a `TokenSink` as it arrives.

Both SGLang (`/generate` with `stream: true`) and vLLM (`/v1/completions` with `stream: true`)
send `data: {json}` events separated by a blank line and end with `data: [DONE]`; an error
after the 200 arrives as an event `{"error": {...}}`. `sse_events` reads them off an aiohttp
response, each event bounded in size (a stream's total is not: SGLang's default repeats the
whole output so far in every event).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol, runtime_checkable

import aiohttp

from tokentrail.engines.base import GenerateRequest, Generation

__all__ = ["SSE_DONE", "StreamingEngine", "TokenSink", "sse_events"]

# Called with each run of newly sampled ids and their logprobs, in order, as they arrive.
TokenSink = Callable[[Sequence[int], Sequence[float]], None]

SSE_DONE = b"[DONE]"


@runtime_checkable
class StreamingEngine(Protocol):
    """An engine that can hand over tokens as they are sampled. The `Generation` returned at
    the end equals what `generate` returns for the same sampled tokens."""

    name: str
    # Whether `generate` itself streams from the engine (`--engine-stream`).
    stream: bool

    async def generate_streaming(self, req: GenerateRequest, sink: TokenSink) -> Generation:
        """Sample one turn, calling `sink` with each run of new tokens as it arrives."""
        ...


class EventTooLong(Exception):
    """An event longer than its bound (internal: the engine client names the fault)."""


async def sse_events(
    resp: aiohttp.ClientResponse, max_event_bytes: int
) -> AsyncIterator[list[bytes]]:
    """The `data` of each event in `resp`'s body, up to `[DONE]` (not included) or the end:
    every complete event of one read together, in order (an engine that samples faster than
    the adapter reads hands over many at once, and they are taken as one run).

    Lines end with LF or CRLF; an event's `data:` lines are joined with LF (the SSE rule);
    comments (`:`) and other fields are skipped. Raises `EventTooLong` for an event over
    `max_event_bytes`."""
    buffer = bytearray()
    data: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        buffer += chunk
        end = buffer.rfind(b"\n")
        if end < 0:
            if len(buffer) > max_event_bytes:
                raise EventTooLong
            continue
        # The complete lines, split in one pass; what follows the last LF waits for more.
        lines = bytes(buffer[:end]).split(b"\n")
        del buffer[: end + 1]
        batch: list[bytes] = []
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if data:
                    event = data[0] if len(data) == 1 else b"\n".join(data)
                    data, size = [], 0
                    if event == SSE_DONE:
                        if batch:
                            yield batch
                        return
                    batch.append(event)
                continue
            if line.startswith(b"data:"):
                value = line[6:] if line.startswith(b"data: ") else line[5:]
                size += len(value) + 1
                if size > max_event_bytes:
                    raise EventTooLong
                data.append(value)
        if batch:
            yield batch
        if len(buffer) > max_event_bytes:
            raise EventTooLong
    if buffer:
        line = bytes(buffer).rstrip(b"\r")
        if line.startswith(b"data:"):
            data.append(line[5:].lstrip(b" ")[: max_event_bytes + 1])
    if data:
        event = b"\n".join(data)
        if event != SSE_DONE:
            yield [event]
