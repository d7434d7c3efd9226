"""The fast paths of engine streaming held to their references on generated streams.

- `streaming._Events` (single-line events cut out by offsets) against the line-by-line SSE
  reader it replaced, over streams of every event shape (multi-line data, comments, other
  fields, CRLF, blank lines, `[DONE]`, events at and over the bound) cut into reads anywhere:
  the same events, the same refusal; a read of single-line events kept unsplit as a `Run`
  (and its slices) among them.
- `sglang_events.FastEvents` (a run read at once by the core, msgspec-typed events, a
  cumulative event read past what was taken) against `StreamCapture.take` on generated SGLang
  streams (cumulative and incremental, every entry and `output_ids` shape, counts that do not
  add up, error events) taken in runs
  of any size: the same tokens handed to the sink in the same runs, the same answer, the same
  error. Reads taken as `Run`s (unsplit) against the same events cut out one by one and
  against the reference reader and capture, on SSE
  bodies with keepalive comments, `data:` with no space, blank lines, `[DONE]` before the
  end, CRLF, events cut short or cut in two.
- The body reader over a real socket: aiohttp's buffer taken whole (the installed aiohttp is
  the one it was written against), the same events as `readany`.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokentrail.engines import GenerateRequest, SamplingParams
from tokentrail.engines.sglang import SGLangEngine, StreamCapture, parse_generate_response
from tokentrail.engines.streaming import (
    SSE_DONE,
    EventTooLong,
    Run,
    _Body,
    _Events,
    sse_events,
)
from tokentrail.errors import EngineError

# --- the SSE reader ------------------------------------------------------------------------


def reference_events(chunks: list[bytes], max_event_bytes: int) -> list[list[bytes]]:
    """The line-by-line reader `_Events` replaced, verbatim but for taking chunks: the runs
    of events each read completes."""
    runs: list[list[bytes]] = []
    buffer = bytearray()
    data: list[bytes] = []
    size = 0
    for chunk in chunks:
        buffer += chunk
        end = buffer.rfind(b"\n")
        if end < 0:
            if len(buffer) > max_event_bytes:
                raise EventTooLong
            continue
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
                            runs.append(batch)
                        return runs
                    batch.append(event)
                continue
            if line.startswith(b"data:"):
                value = line[6:] if line.startswith(b"data: ") else line[5:]
                size += len(value) + 1
                if size > max_event_bytes:
                    raise EventTooLong
                data.append(value)
        if batch:
            runs.append(batch)
        if len(buffer) > max_event_bytes:
            raise EventTooLong
    if buffer:
        line = bytes(buffer).rstrip(b"\r")
        if line.startswith(b"data:"):
            data.append(line[5:].lstrip(b" ")[: max_event_bytes + 1])
    if data:
        event = b"\n".join(data)
        if event != SSE_DONE:
            runs.append([event])
    return runs


def fast_events(chunks: list[bytes], max_event_bytes: int) -> list[list[bytes]]:
    """`_Events` as `sse_events` drives it: a read whole as a `Run` where it is one (the stream
    over where a `[DONE]` ends it), else event by event."""
    parser = _Events(max_event_bytes)
    runs: list[list[bytes]] = []
    for chunk in chunks:
        run = parser.run(chunk)
        if run is not None:
            if run:
                assert isinstance(run, Run)
                runs.append(run_events(run))
            if parser.done:
                return runs
            continue
        batch: list[Any] = []
        done = parser.feed(chunk, batch)
        if batch:
            runs.append([bytes(e) for e in batch])
        if done:
            return runs
    event = parser.end()
    if event is not None and event != SSE_DONE:
        runs.append([event])
    return runs


def run_events(run: Run) -> list[bytes]:
    """A `Run`'s events, its slices held to those of the split list."""
    events = [bytes(e) for e in run]
    fresh = Run(run.body, len(run))  # not yet split: the slices cut it themselves
    assert len(fresh) == len(events)
    assert list(fresh[:1]) == events[:1]
    assert list(Run(run.body, len(run))[1:]) == events[1:]
    assert list(Run(run.body, len(run))[-1:]) == events[-1:]
    assert fresh[-1] == events[-1]
    return events


def outcome(read: Callable[[], list[list[bytes]]]) -> Any:
    try:
        runs = read()
    except EventTooLong:
        return "too long"
    return [e for run in runs for e in run]


_payload = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b""))
_line = st.one_of(
    _payload.map(lambda p: b"data: " + p),
    _payload.map(lambda p: b"data:" + p),
    _payload.map(lambda p: b": " + p),  # a comment
    _payload.map(lambda p: b"event: " + p),
    st.just(b"data: [DONE]"),
)
_block = st.lists(_line, min_size=1, max_size=3)


def cut(body: bytes, cuts: list[int]) -> list[bytes]:
    """`body` as the reads that end at `cuts` (empty reads left out)."""
    edges = [0, *cuts, len(body)]
    return [body[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]


def assert_reads_like_the_line_reader(body: bytes, cuts: list[int], bound: int) -> None:
    chunks = cut(body, cuts)
    assert outcome(lambda: fast_events(chunks, bound)) == outcome(
        lambda: reference_events(chunks, bound)
    )


@st.composite
def sse_stream(draw: Any) -> tuple[bytes, list[int]]:
    crlf = draw(st.booleans()) and draw(st.booleans())
    nl = b"\r\n" if crlf else b"\n"
    out = b""
    for lines in draw(st.lists(_block, max_size=12)):
        out += b"".join(line + nl for line in lines) + nl * draw(st.integers(1, 2))
    if draw(st.booleans()):  # the body ends mid-event, or on an event with no blank line
        out += draw(_line) + draw(st.sampled_from([b"", nl]))
    cuts = sorted(draw(st.lists(st.integers(0, max(0, len(out))), max_size=8)))
    return out, cuts


_json_payload = st.binary(max_size=30).map(
    lambda b: b'{"a":"' + b.replace(b"\n", b"").replace(b"\r", b"").replace(b'"', b"") + b'"}'
)


@st.composite
def data_stream(draw: Any) -> tuple[bytes, list[int]]:
    """Mostly what an engine sends (`data: {json}` and a blank line, an event a write), now
    and then something else among them: a keepalive comment, `data:` with no space or two,
    a blank line more, an empty event, `[DONE]` before the end, CRLF line ends."""
    crlf = draw(st.integers(0, 9)) == 0
    nl = b"\r\n" if crlf else b"\n"
    odd = st.sampled_from(
        [b": keepalive", b"data:{}", b"data:  {}", b"", b"data: ", b"data: [DONE]", b"event: x"]
    )
    out = b""
    for _ in range(draw(st.integers(0, 30))):
        if draw(st.integers(0, 14)) == 0:
            out += draw(odd) + nl + nl
        else:
            out += b"data: " + draw(_json_payload) + nl + nl
    if draw(st.booleans()):
        out += b"data: [DONE]" + nl + nl
    cuts = sorted(draw(st.lists(st.integers(0, max(0, len(out))), max_size=5)))
    return out, cuts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=data_stream(), bound=st.sampled_from([12, 40, 1 << 20]))
def test_the_run_reader_equals_the_line_reader(stream: tuple[bytes, list[int]], bound: int) -> None:
    """Reads that are runs of single-line events (kept unsplit) and reads with anything
    else in them: the same events in the same runs as the line reader, the same refusal."""
    assert_reads_like_the_line_reader(*stream, bound)


def test_a_run_of_single_line_events_is_kept_unsplit() -> None:
    parser = _Events(1 << 20)
    run = parser.run(b'data: {"a":1}\n\ndata: {"a":2}\n\ndata: {"a"')
    assert isinstance(run, Run) and len(run) == 2 and run._events is None
    assert [bytes(e) for e in run] == [b'{"a":1}', b'{"a":2}']
    # `[DONE]` ends the run before it, and the stream.
    last = parser.run(b":3}\n\ndata: [DONE]\n\n")
    assert isinstance(last, Run) and [bytes(e) for e in last] == [b'{"a":3}'] and parser.done
    assert _Events(1 << 20).run(b"data: [DONE]\n\n") == []
    # The line reader says the same.
    out: list[Any] = []
    assert _Events(1 << 20).feed(b'data: {"a":3}\n\ndata: [DONE]\n\n', out)
    assert [bytes(e) for e in out] == [b'{"a":3}']
    for odd in (b": ping\n\n", b"data:{}\n\n", b"data: {}\r\n\r\n", b"\ndata: {}\n\n"):
        assert _Events(1 << 20).run(b"data: {}\n\n" + odd) is None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=sse_stream(), bound=st.sampled_from([8, 20, 45, 1 << 20]))
def test_the_event_reader_equals_the_line_reader(
    stream: tuple[bytes, list[int]], bound: int
) -> None:
    assert_reads_like_the_line_reader(*stream, bound)


def test_a_cumulative_streams_events_are_views_of_what_was_read() -> None:
    """Single-line events are not copied out of the read (a skipped cumulative event costs a
    search for its LF, not a copy)."""
    parser = _Events(1 << 20)
    chunk = b'data: {"a":1}\n\ndata: {"a":2}\n\ndata: {"a"'
    out: list[Any] = []
    assert not parser.feed(chunk, out)
    assert [bytes(e) for e in out] == [b'{"a":1}', b'{"a":2}']
    assert all(isinstance(e, memoryview) and e.obj is chunk for e in out)
    assert parser.feed(b":3}\n\ndata: [DONE]\n\n", out)
    assert bytes(out[-1]) == b'{"a":3}'


# --- SGLang's events -----------------------------------------------------------------------


def sglang_events(
    rng: random.Random, cumulative: bool, n: int, step: int, odd: bool | None = None
) -> list[bytes]:
    """SGLang `/generate` stream events for `n` tokens, `step` an event, with the odd shapes
    an engine may send: ints and bools for logprobs, two- or four-element entries, text in
    the entries, `output_ids` absent or null or disagreeing, a count off by one, an error."""
    ids = [rng.randrange(151643) for _ in range(n)]
    lps = [rng.choice([0, -1, -0.5, -rng.random() * 10 ** rng.randint(-8, 1)]) for _ in range(n)]
    odd = rng.random() < 0.5 if odd is None else odd

    def entry(i: int) -> list[Any]:
        e: list[Any] = [lps[i], ids[i], None]
        if odd and rng.random() < 0.05:
            e = rng.choice([[True, ids[i], None], [lps[i], ids[i]], [lps[i], ids[i], "x", 1]])
        elif odd and rng.random() < 0.05:
            e[2] = "tok"
        return e

    entries = [entry(i) for i in range(n)]
    events = []
    at = 0
    while at < n:
        end = min(n, at + step)
        last = end == n
        meta: dict[str, Any] = {
            "id": "r",
            "finish_reason": {"type": "stop"} if last else None,
            "prompt_tokens": 5,
            "output_token_logprobs": entries[:end] if cumulative else entries[at:end],
            "completion_tokens": end,
        }
        out_ids: Any = ids[:end] if cumulative else ids[at:end]
        if odd and rng.random() < 0.1:
            out_ids = rng.choice([None, "absent", ids[at:end], ids[: max(0, end - 1)]])
        if odd and rng.random() < 0.03:
            meta["completion_tokens"] = end + rng.choice([-1, 1])
        obj: dict[str, Any] = {"text": None if not last else "", "meta_info": meta}
        if out_ids != "absent":
            obj["output_ids"] = out_ids
        if odd and rng.random() < 0.02:
            obj["error"] = {"message": "CUDA error", "code": 500}
        spaced = odd and rng.random() < 0.1
        events.append(json.dumps(obj, separators=(", ", ": ") if spaced else (",", ":")).encode())
        at = end
    return events


def capture_run(
    events: list[bytes], cuts: list[int], fast: bool, max_new: int = 4096
) -> tuple[Any, ...]:
    """What a capture makes of `events` taken in the runs `cuts` marks: the sink's runs, the
    answer's ids and logprobs (or the error), and whether it went cumulative."""
    req = GenerateRequest(
        input_ids=[1, 2, 3, 4, 5],
        sampling=SamplingParams(max_new_tokens=max_new),
        session_id="s",
        request_id="r",
    )
    runs: list[tuple[list[int], list[float]]] = []
    capture = StreamCapture(req, lambda i, lp: runs.append((list(i), list(lp))))
    if not fast:
        capture.fast.take = lambda event: False  # type: ignore[method-assign]
        capture.fast.take_incremental_run = lambda events: False  # type: ignore[method-assign]
    engine = SGLangEngine("http://127.0.0.1:9")

    def decode(event: Any) -> Any:
        return engine._event_json("url", event)

    edges = [0, *cuts, len(events)]
    try:
        for a, b in zip(edges, edges[1:], strict=False):
            if b > a:
                capture.take_run([memoryview(e) for e in events[a:b]], decode)
        gen = parse_generate_response(capture.final(), req, 0.0)
    except EngineError as exc:
        return ("error", type(exc), str(exc), runs)
    return (gen.output_ids, gen.logprobs, gen.finish_reason, runs, capture.cumulative)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    cumulative=st.booleans(),
    n=st.integers(1, 60),
    step=st.integers(1, 7),
    cuts=st.lists(st.integers(0, 60), max_size=10),
    max_new=st.sampled_from([4096, 20]),
)
def test_fast_sglang_events_equal_the_reference(
    seed: int, cumulative: bool, n: int, step: int, cuts: list[int], max_new: int
) -> None:
    events = sglang_events(random.Random(seed), cumulative, n, step)
    cuts = sorted(c for c in cuts if c <= len(events))
    fast = capture_run(events, cuts, True, max_new)
    slow = capture_run(events, cuts, False, max_new)
    assert fast == slow


def sse_body(rng: random.Random, events: list[bytes]) -> bytes:
    """`events` framed as an engine sends them, with now and then what one may send among
    them: a keepalive comment, `data:` with no space, a blank line more, an event's JSON cut
    in two (at a comma, so the two halves join into JSON again) or cut short, `[DONE]` before
    the end; CRLF line ends for a whole stream."""
    nl = b"\r\n" if rng.random() < 0.1 else b"\n"
    odd = rng.random() < 0.5

    def chance(p: float) -> bool:
        return odd and rng.random() < p

    out = b""
    for event in events:
        if chance(0.02):
            out += b": keepalive" + nl + nl
        if chance(0.02):
            out += nl
        if chance(0.005):
            out += b"data: [DONE]" + nl + nl
        if chance(0.05) and b"," in event:
            cut = rng.choice([at for at, byte in enumerate(event) if byte == ord(",")])
            out += b"data: " + event[:cut] + nl + nl + b"data: " + event[cut + 1 :] + nl + nl
            continue
        if chance(0.02):
            event = event[: rng.randrange(len(event))]
        out += (b"data:" if chance(0.02) else b"data: ") + event + nl + nl
    return out + b"data: [DONE]" + nl + nl


def capture_sse(body: bytes, cuts: list[int], how: str) -> tuple[Any, ...]:
    """What a capture makes of the SSE `body` read in the chunks `cuts` marks: `run` as
    `sse_events` reads them (a read of single-line events whole, as a `Run`) into the fast
    capture, `events` event by event into the fast capture, `reference` by the line reader
    into the reference capture."""
    chunks = cut(body, cuts)
    runs: list[Any] = []
    if how == "reference":
        runs = reference_events(chunks, 1 << 20)
    else:
        parser = _Events(1 << 20)
        for chunk in chunks:
            run = parser.run(chunk) if how == "run" else None
            if run is not None:
                runs.append(run)
                continue
            batch: list[Any] = []
            done = parser.feed(chunk, batch)
            if batch:
                runs.append(batch)
            if done:
                break
        else:
            event = parser.end()
            if event is not None and event != SSE_DONE:
                runs.append([event])
    req = GenerateRequest(
        input_ids=[1, 2, 3, 4, 5],
        sampling=SamplingParams(max_new_tokens=4096),
        session_id="s",
        request_id="r",
    )
    sunk: list[tuple[list[int], list[float]]] = []
    capture = StreamCapture(req, lambda i, lp: sunk.append((list(i), list(lp))))
    if how == "reference":
        capture.fast.take = lambda event: False  # type: ignore[method-assign]
        capture.fast.take_incremental_run = lambda events: False  # type: ignore[method-assign]
    engine = SGLangEngine("http://127.0.0.1:9")
    try:
        for run in runs:
            capture.take_run(run, lambda e: engine._event_json("url", e))
        gen = parse_generate_response(capture.final(), req, 0.0)
    except EngineError as exc:
        return ("error", type(exc), str(exc), sunk)
    return (gen.output_ids, gen.logprobs, gen.finish_reason, sunk, capture.cumulative)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    cumulative=st.sampled_from([False, False, False, True]),
    n=st.integers(1, 80),
    step=st.integers(1, 3),
    cuts=st.lists(st.integers(0, 8000), max_size=6),
)
def test_runs_read_unsplit_equal_events_one_by_one_and_the_reference(
    seed: int, cumulative: bool, n: int, step: int, cuts: list[int]
) -> None:
    """Reads of single-line events taken as `Run`s against the same events cut out one by
    one and against the reference reader and capture, on generated SGLang streams framed
    with what an engine may send among its events."""
    rng = random.Random(seed)
    body = sse_body(rng, sglang_events(rng, cumulative, n, step))
    cuts = sorted(c for c in cuts if c <= len(body))
    reference = capture_sse(body, cuts, "reference")
    assert capture_sse(body, cuts, "events") == reference
    assert capture_sse(body, cuts, "run") == reference


def test_a_cumulative_stream_is_read_past_what_was_taken() -> None:
    """Once cumulative, an event's entries are decoded only past those taken: its head is the
    bytes of the last event's, and a changed head goes the reference way."""
    events = sglang_events(random.Random(1), True, 40, 1, odd=False)
    req = GenerateRequest(
        input_ids=[1], sampling=SamplingParams(max_new_tokens=64), session_id="s", request_id="r"
    )
    capture = StreamCapture(req, lambda i, lp: None)
    decoded: list[bytes] = []
    engine = SGLangEngine("http://127.0.0.1:9")
    fast = capture.fast
    original = fast._suffix

    def suffix(raw: bytes, head: bytes | None, decoder: Any) -> Any:
        got = original(raw, head, decoder)
        if got is not None:
            decoded.append(raw[len(head or b"") :])
        return got

    fast._suffix = suffix  # type: ignore[method-assign]
    for event in events:
        capture.take_run([event], lambda e: engine._event_json("url", e))
    assert capture.cumulative
    # The first two are read whole (the second shows the stream cumulative), the third whole
    # and its bytes kept; every later one only past what was taken, entries and ids alike.
    assert len(decoded) == 2 * (len(events) - 3)
    assert all(len(d) < 40 for d in decoded)
    assert capture.final()["output_ids"] == json.loads(events[-1])["output_ids"]


# --- the body reader over a real socket ---------------------------------------------------


async def _serve_sse(events: list[bytes], delay: float) -> tuple[web.AppRunner, str]:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in events:
            await resp.write(b"data: " + event + b"\n\n")
            if delay:
                await asyncio.sleep(delay)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/s", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}/s"


@pytest.mark.parametrize("fast", [True, False])
def test_the_body_reader_takes_aiohttps_buffer_whole(fast: bool) -> None:
    import aiohttp

    events = [json.dumps({"i": i, "pad": "x" * (i % 50)}).encode() for i in range(400)]

    async def go() -> tuple[list[bytes], int, bool]:
        runner, url = await _serve_sse(events, 0.0)
        try:
            async with aiohttp.ClientSession() as http, http.get(url) as resp:
                used = _Body(resp).fast
                if not fast:
                    original = _Body.__init__

                    def slow(self: _Body, r: Any) -> None:
                        original(self, r)
                        self.fast = False

                    _Body.__init__ = slow  # type: ignore[method-assign]
                try:
                    got = [bytes(e) async for run in sse_events(resp, 1 << 20, 0.002) for e in run]
                finally:
                    if not fast:
                        _Body.__init__ = original  # type: ignore[method-assign]
                return got, len(got), used
        finally:
            await runner.cleanup()

    got, n, used = asyncio.run(go())
    assert got == events and n == 400
    # The aiohttp installed is the one `_Body` reads the buffer of.
    assert used


def test_a_pause_after_each_run_gathers_the_events_that_arrive_meanwhile() -> None:
    import aiohttp

    events = [json.dumps({"i": i}).encode() for i in range(60)]

    async def go(coalesce: float) -> list[int]:
        runner, url = await _serve_sse(events, 0.001)
        try:
            async with aiohttp.ClientSession() as http, http.get(url) as resp:
                return [len(run) async for run in sse_events(resp, 1 << 20, coalesce)]
        finally:
            await runner.cleanup()

    held = asyncio.run(go(0.03))
    assert sum(held) == 60
    # Events written 1 ms apart, a run taken at most every 30 ms: far fewer runs than events.
    assert len(held) <= 20


def test_the_pauses_grow_while_the_stream_keeps_coming_and_start_again_after_a_stall() -> None:
    """The first run is never held; for the stream's first `COALESCE_STEADY_S` the pause is
    the first, then each is `COALESCE_GROWTH` times the last, up to the cap; a wait for the
    engine as long as the cap (a stall) starts them again from the first, so what follows it
    reaches the harness as promptly as a turn's start."""
    import aiohttp

    events = [json.dumps({"i": i}).encode() for i in range(70)]

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, event in enumerate(events):
            await resp.write(b"data: " + event + b"\n\n")
            await asyncio.sleep(0.6 if i == 49 else 0.01)  # a stall after the 50th
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    pauses: list[float] = []
    original = _Body.hold

    async def hold(self: _Body, seconds: float) -> None:
        pauses.append(seconds)
        await original(self, seconds)

    async def go() -> list[bytes]:
        app = web.Application()
        app.router.add_get("/s", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://{host}:{port}/s") as resp:
                    runs = sse_events(resp, 1 << 20, 0.02, 0.1)
                    return [bytes(e) async for run in runs for e in run]
        finally:
            await runner.cleanup()

    _Body.hold = hold  # type: ignore[method-assign]
    try:
        got = asyncio.run(go())
    finally:
        _Body.hold = original  # type: ignore[method-assign]
    assert got == events
    first, cap = 0.02, 0.1
    # Each pause the last, or grown by half (capped), or the first again (after the stall).
    for a, b in zip(pauses, pauses[1:], strict=False):
        assert b == pytest.approx(a) or b == pytest.approx(min(cap, a * 1.5)) or b == first
    stall = next(i for i in range(1, len(pauses)) if pauses[i] < pauses[i - 1])
    before, after = pauses[:stall], pauses[stall:]
    # The stream's first 100 ms at 20 ms; the 30, 45, 67.5 ms and the cap before the stall.
    assert before[:3] == pytest.approx([first] * 3) and before[-1] == pytest.approx(cap)
    assert after[:2] == pytest.approx([first] * 2)  # the steady start again
    assert len(pauses) < 30  # a run every 10 ms was taken far fewer times than 70
