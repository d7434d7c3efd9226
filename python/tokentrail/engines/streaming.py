"""Engine streaming: an engine's answer read as server-sent events while it samples, each new
token id and its logprob handed to a `TokenSink` as it arrives.

Both SGLang (`/generate` with `stream: true`) and vLLM (`/v1/completions` with `stream: true`)
send `data: {json}` events separated by a blank line and end with `data: [DONE]`; an error
after the 200 arrives as an event `{"error": {...}}`. `sse_events` reads them off an aiohttp
response, each event bounded in size (a stream's total is not: SGLang's default repeats the
whole output so far in every event).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import aiohttp

from tokentrail.core.backend import load_backend
from tokentrail.engines.base import GenerateRequest, Generation
from tokentrail.engines.connection import EngineConnection
from tokentrail.errors import ChunkedBodyError
from tokentrail.kinds import Backend

__all__ = [
    "COALESCE_GROWTH",
    "COALESCE_MAX_S",
    "COALESCE_S",
    "COALESCE_STEADY_S",
    "SSE_DONE",
    "Event",
    "Run",
    "RunCapture",
    "StreamingEngine",
    "TokenSink",
    "sse_events",
]

# With this set (the test suite sets it, for every stream it sends), each read of a body whose
# framing the core takes off is read by the reference too, and the two must agree.
VERIFY_CHUNKS_ENV = "TOKENTRAIL_VERIFY_CHUNKS"
VERIFY_CHUNKS = os.environ.get(VERIFY_CHUNKS_ENV, "") not in ("", "0")

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


class RunCapture(Protocol):
    """What an engine client hands a stream's events to, a run at a time."""

    def take_run(self, events: Sequence[Event], decode: Callable[[Event], Any]) -> None:
        """Take `events` (their `data`, in order; `decode` reads one as the client reads
        JSON, an error event raising) and hand their tokens to the sink in one call."""
        ...


class Run(Sequence[bytes]):
    """The events of one read where each is a single `data: ` line and a blank one, and
    nothing else is there (no comment, other field, CR or `[DONE]`): kept as the bytes read,
    split in one call where its events are asked for (not cut out one at a time), and not
    at all where only its first, its last or all but its first are."""

    __slots__ = ("_events", "body", "size")

    def __init__(self, body: bytes, size: int) -> None:
        # `data: ` + the events' data joined by `\n\ndata: ` + `\n\n`.
        self.body = body
        self.size = size
        self._events: list[bytes] | None = None

    def __len__(self) -> int:
        return self.size

    def events(self) -> list[bytes]:
        if self._events is None:
            self._events = self.body[len(RUN_OPEN) : -len(RUN_END)].split(RUN_SEP)
        return self._events

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice) and index.step is None and self._events is None:
            # The slices an engine client takes (the first event, the rest, the last) without
            # splitting the whole run.
            if index == slice(None, 1) and self.size > 1:
                return [self.body[len(RUN_OPEN) : self.body.find(RUN_SEP)]]
            if index == slice(1, None) and self.size > 1:
                # The rest starts at the separator's `data: `: a run's body of its own.
                rest = self.body.find(RUN_SEP) + len(RUN_SEP) - len(RUN_OPEN)
                return Run(self.body[rest:], self.size - 1)
            if index == slice(-1, None) and self.size > 1:
                return [self.body[self.body.rfind(RUN_SEP) + len(RUN_SEP) : -len(RUN_END)]]
        return self.events()[index]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.events())


# A `Run`'s body: `RUN_OPEN` + the events' data joined by `RUN_SEP` + `RUN_END`.
RUN_OPEN, RUN_SEP, RUN_END = b"data: ", b"\n\ndata: ", b"\n\n"


class EventTooLong(Exception):
    """An event longer than its bound (internal: the engine client names the fault)."""


# An event's `data`: a view of the bytes read where it is one line (no copy: a cumulative
# stream's skipped events are never copied), else the joined lines.
Event = bytes | memoryview

# After a run is taken, the engine's socket is left unread a while, so that the events sampled
# meanwhile arrive in one read and go on as one run: an engine sends each token's event as its
# own write (TCP segment, HTTP chunk), and without a pause each is read, parsed, handed to the
# sink and written to the harness alone (about 0.3-0.5 ms of CPU a run on a loaded 2-core box,
# a third of it the wake-up itself). The first event is never held; for the first
# `COALESCE_STEADY_S` of a stream the pause is `COALESCE_S` (a short reply reaches the harness
# in several deltas, as the real Codex test asks), then each next one is `COALESCE_GROWTH`
# times the last, up to `COALESCE_MAX_S`, while the stream keeps coming: a long reply costs a
# few runs a second, not fifty. Where the engine sent nothing for `COALESCE_MAX_S` (a stall),
# the pauses start again from the first, so the tokens after it go out as promptly as a turn's
# first ones. A run of `FULL_RUN_BYTES` or more that a longer pause did not make larger (by
# `FULL_RUN_GAIN`) sets the pause back to the first too: the socket's buffer was full, the
# engine's writes waited on it while it was not read (SGLang's default stream repeats every
# token so far in every event, tens of KB each), and a longer pause would only slow the stream
# down.
COALESCE_S = 0.02
COALESCE_STEADY_S = 0.1
COALESCE_GROWTH = 1.5
COALESCE_MAX_S = 0.2
FULL_RUN_BYTES = 64 * 1024
FULL_RUN_GAIN = 1.2
# The chunks of one read are split as one buffer where they average up to this size (a copy
# of small events costs less than a pass per event); a cumulative stream's large events are
# split chunk by chunk, uncopied.
JOIN_BYTES = 4096


async def sse_events(
    resp: aiohttp.ClientResponse,
    max_event_bytes: int,
    coalesce_s: float = 0.0,
    coalesce_max_s: float = COALESCE_MAX_S,
) -> AsyncIterator[Sequence[Event]]:
    """The `data` of each event in `resp`'s body, up to `[DONE]` (not included) or the end:
    every complete event of one read together, in order (an engine that samples faster than
    the adapter reads hands over many at once, and they are taken as one run). After each run
    the connection is not read for a pause, so the next run holds what arrived meanwhile:
    `coalesce_s` (0: none) for the stream's first `COALESCE_STEADY_S`, then each next one
    `COALESCE_GROWTH` times longer up to `coalesce_max_s`; from the first again after a wait of
    `coalesce_max_s` for the engine (then `COALESCE_STEADY_S` at the first again) or a full
    socket buffer (a run of `FULL_RUN_BYTES` that did not grow with the pause).

    Lines end with LF or CRLF; an event's `data:` lines are joined with LF (the SSE rule);
    comments (`:`) and other fields are skipped. Raises `EventTooLong` for an event over
    `max_event_bytes`."""
    parser = _Events(max_event_bytes)
    body = _Body(resp)
    loop = asyncio.get_running_loop()
    pause = coalesce_s
    last = 0  # the size of the run before the last pause
    steady = 0.0  # when the pauses may start to grow
    while True:
        asked = loop.time()
        chunks = await body.read()
        if not chunks:
            break
        size = sum(map(len, chunks))
        now = loop.time()
        if not steady or now - asked >= coalesce_max_s:
            pause, steady = coalesce_s, now + COALESCE_STEADY_S  # a start, or after a stall
        elif FULL_RUN_BYTES <= size < last * FULL_RUN_GAIN:
            pause = coalesce_s  # the engine waits on this socket
        batch: Sequence[Event] | None = None
        if len(chunks) > 1 and size <= JOIN_BYTES * len(chunks):
            chunks = [b"".join(chunks)]  # small events: one pass over them, not one a chunk
        if len(chunks) == 1:
            # Where they are all single-line events, they are left unsplit as one run.
            batch = parser.run(chunks[0])
            if batch is not None and parser.done:
                if batch:
                    yield batch
                return
        if batch is None:
            events: list[Event] = []
            for chunk in chunks:
                if parser.feed(chunk, events):
                    if events:
                        yield events
                    return
            batch = events
        if batch:
            yield batch
            if pause:
                last = size
                await body.hold(pause)
                if loop.time() >= steady:
                    pause = min(coalesce_max_s, pause * COALESCE_GROWTH)
    event = parser.end()
    if event is not None and event != SSE_DONE:
        yield [event]


class _Events:
    """Server-sent events split out of the bytes read, a read at a time. The common shape (a
    single `data:` line an event, LF line ends) is cut out by offsets; anything else goes
    through the general reader of lines, which keeps an event's lines across reads."""

    def __init__(self, max_event_bytes: int) -> None:
        self.max = max_event_bytes
        self.core = load_backend()
        self.done = False  # a `[DONE]` event ended the last run
        self.rest = b""  # what follows the last complete event (fast) or line (general)
        self.data: list[bytes] = []  # the general reader's lines of the event it is in
        self.size = 0

    def feed(self, chunk: bytes, out: list[Event]) -> bool:
        """Append the events completed by `chunk` to `out`; True at `[DONE]`."""
        buf = self.rest + chunk if self.rest else chunk
        if self.data or b"\r" in buf:
            return self._lines(buf, out)
        pos, n = 0, len(buf)
        view = memoryview(buf)
        while True:
            # A single `data:` line and a blank one; the search is for LF alone (memchr:
            # many times faster than for two bytes, over a cumulative stream's every byte).
            while buf.startswith(b"\n", pos):  # blank lines between events
                pos += 1
            end = buf.find(b"\n", pos)
            if end < 0 or end + 1 >= n:
                break
            if buf[end + 1] == 10 and buf.startswith(b"data:", pos):
                start = pos + 6 if buf.startswith(b"data: ", pos) else pos + 5
                if end - start + 1 > self.max:
                    raise EventTooLong
                event: Event = view[start:end]
                if event == SSE_DONE:
                    return True
                out.append(event)
                pos = end + 2
                continue
            # Anything else (several lines, comments, other fields): up to its blank line,
            # through the general reader.
            end = buf.find(b"\n\n", end)
            if end < 0:
                break
            if self._lines(buf[pos : end + 2], out):
                return True
            pos = end + 2
        self.rest = buf[pos:] if pos < n else b""
        if len(self.rest) > self.max:
            # Its complete lines may already hold more data than an event may; the general
            # reader counts them as the line reader always has.
            rest, self.rest = self.rest, b""
            return self._lines(rest, out)
        return False

    def run(self, chunk: bytes) -> Sequence[Event] | None:
        """The complete events of `chunk` as a `Run` where they are all of its shape (the
        rest kept for the next read; `core.sse_run`, one pass; `done` set where a `[DONE]`
        event ends them), else None with nothing taken, for `feed`."""
        if self.data:
            return None
        buf = self.rest + chunk if self.rest else chunk
        shape = self.core.sse_run(buf, self.max)
        if shape is None:
            return None  # (with a CR, what is kept for the next read may end an event)
        end, events, self.done = shape
        self.rest = buf[end:]
        if not events:
            return []
        return Run(buf[:end] if end < len(buf) else buf, events)

    def _lines(self, buf: bytes, out: list[Event]) -> bool:
        """The general reader: complete lines of `buf`, what follows the last LF kept."""
        end = buf.rfind(b"\n")
        if end < 0:
            self.rest = buf
            if len(buf) > self.max:
                raise EventTooLong
            return False
        lines = buf[:end].split(b"\n")
        self.rest = buf[end + 1 :]
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self.data:
                    data = self.data
                    event = data[0] if len(data) == 1 else b"\n".join(data)
                    self.data, self.size = [], 0
                    if event == SSE_DONE:
                        return True
                    out.append(event)
                continue
            if line.startswith(b"data:"):
                value = line[6:] if line.startswith(b"data: ") else line[5:]
                self.size += len(value) + 1
                if self.size > self.max:
                    raise EventTooLong
                self.data.append(value)
        if len(self.rest) > self.max:
            raise EventTooLong
        return False

    def end(self) -> bytes | None:
        """The event the body's end completes, if any (the last line needs no LF)."""
        if b"\n" in self.rest:
            self._lines(self.rest, [])  # no blank line in it: it completes no event
        line = self.rest.rstrip(b"\r")
        if line.startswith(b"data:"):
            self.data.append(line[5:].lstrip(b" ")[: self.max + 1])
        return b"\n".join(self.data) if self.data else None


class _Body:
    """The chunks of a response body as they arrive, all that is buffered at once.

    aiohttp hands its buffer over chunk by chunk, each one a call into the connection's flow
    control, and an engine sends one HTTP chunk an event: where aiohttp's reader is the one
    this was written against, its buffer is taken whole instead (`readany` otherwise). Where
    the connection hands an event stream over undecoded (`engines.connection`), the chunk
    framing is taken off here, in the core, a read at a time."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.content = resp.content
        self.fast = type(self.content) is aiohttp.StreamReader and all(
            hasattr(self.content, name) for name in _READER_FIELDS
        )
        conn = resp.connection
        self.transport = conn.transport if conn is not None else None
        protocol = conn.protocol if conn is not None else None
        # The connection whose undecoded body this is, until its last chunk is read.
        self.framed = (
            protocol
            if isinstance(protocol, EngineConnection) and protocol.raw_body is self.content
            else None
        )
        self.core = load_backend()
        self.left = 0  # bytes of the current chunk still to come (its data and CRLF)
        self.carry = b""  # a size line or trailers not complete in the last read

    async def read(self) -> list[bytes]:
        """What arrived since the last call (waiting for something); empty at the end."""
        while True:
            chunks = await self._take()
            framed = self.framed
            if framed is None:
                return chunks
            if not chunks:
                # aiohttp's parser, still in the body, refuses an end before the last chunk.
                raise ChunkedBodyError("the body ended before its last chunk")
            buf = b"".join([self.carry, *chunks]) if self.carry or len(chunks) > 1 else chunks[0]
            body, end, self.left, last = self._unchunk(buf)
            self.carry = buf[end:]
            if last:
                self.framed = None
                framed.end_raw_body(self.carry)
                self.carry = b""
            if body:
                return [body]
            if last:
                return []

    def _unchunk(self, buf: bytes) -> tuple[bytes, int, int, bool]:
        """`core.http_chunks` of `buf` from where the last read left off."""
        got = self.core.http_chunks(buf, self.left)
        if VERIFY_CHUNKS and load_backend(Backend.PYTHON).http_chunks(buf, self.left) != got:
            raise ChunkedBodyError(
                f"the core's reading of a chunked body is not the reference's "
                f"({VERIFY_CHUNKS_ENV} is set)"
            )
        return got

    async def _take(self) -> list[bytes]:
        if not self.fast:
            chunk = await self.content.readany()
            return [chunk] if chunk else []
        content: Any = self.content
        first = await content.read(1)  # waits for data; a view of the first chunk's byte
        if not first:
            return []
        buffer = content._buffer
        if not buffer:
            return [first]
        chunks = list(buffer)
        offset = content._buffer_offset
        if offset:  # the first chunk is still there, `first` its byte before `offset`
            chunks[0] = chunks[0][offset - 1 :]
        else:
            chunks.insert(0, first)
        buffer.clear()
        content._buffer_offset = 0
        taken = content._size
        content._size = 0
        content._cursor += taken
        splits = content._http_chunk_splits
        if splits:
            splits.clear()
        content._protocol.resume_reading()  # the buffer is empty: below its low-water mark
        return chunks

    async def hold(self, seconds: float) -> None:
        """Leave the socket unread for `seconds`: what arrives meanwhile is read at once."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.pause_reading()
        try:
            await asyncio.sleep(seconds)
        finally:
            if not transport.is_closing():
                transport.resume_reading()


# What `_Body` takes from aiohttp's `StreamReader`, looked for when a body is opened (`readany`
# where one is missing; a test holds the installed aiohttp to having them all).
_READER_FIELDS = (
    "_buffer",
    "_buffer_offset",
    "_size",
    "_cursor",
    "_http_chunk_splits",
    "_protocol",
)
