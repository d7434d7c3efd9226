"""What would hold the event loop, at the sizes the field runs at: a long turn's engine answer
(109K tokens, 3 MB of JSON), a 20 MB image's request (27 MB of base64). Each heavy step runs off
the loop thread, and no single call the interpreter cannot leave (a parse, a base64 pass, a
copy) spans the whole of such a payload: the loop gets the interpreter back in between.

The targets these hold (`/healthz` p99 during four 20 MB image requests, and with 40 clients
that never read their streams) are measured by `benches/loop_responsiveness.py --images`.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import sys
import threading
from typing import Any

import aiohttp
import anthropic
import msgspec
import numpy as np
import pytest
from aiohttp import web

from support.fake_engines import IM_END, FakeSGLang
from tokentrail.adapter import Adapter, start_server
from tokentrail.adapter.protocols import protocols
from tokentrail.adapter.request import lift, parse, read
from tokentrail.adapter.request.parse import parse_reusing
from tokentrail.adapter.turn import turns as turns_module
from tokentrail.engines import sglang as sglang_module
from tokentrail.engines import wire_json
from tokentrail.engines.sglang import SGLangEngine
from tokentrail.engines.wire_json import PIECE_BYTES, Rows, loads_in_pieces
from tokentrail.errors import RequestTooLarge
from tokentrail.messages import b64encode_in_pieces
from tokentrail.text import detokenize
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer
from tokentrail.text.vision import b64decode_in_pieces

# A long turn: as many tokens as the bench's 730 KB reply.
LONG_TURN = 109_000
ANTHROPIC = next(p for p in protocols() if p.name == "anthropic")


@pytest.fixture(scope="module")
def tokenizer() -> LoadedTokenizer:
    return load_tokenizer("builtin:qwen3")


def sglang_answer(n: int, indent: int | None = None) -> bytes:
    ids = [(k * 7919 + 151) % 151_000 for k in range(n)]
    meta = {
        "id": "r",
        "finish_reason": {"type": "stop", "matched": IM_END},
        "output_token_logprobs": [[-0.25 - k % 7, t, None] for k, t in enumerate(ids)],
        "completion_tokens": n,
        "e2e_latency": 0.001,
    }
    body = {"text": "", "output_ids": ids, "meta_info": meta}
    separators = (",", ":") if indent is None else None
    return json.dumps(body, indent=indent, separators=separators).encode()


class LargestCall:
    """Wraps a parse or encode function, keeping the largest input it was given."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.largest = 0

    def __call__(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        self.largest = max(self.largest, len(data))
        return self.fn(data, *args, **kwargs)


# -- the engine's answer ----------------------------------------------------------------------


def test_a_long_answer_is_parsed_in_pieces_and_reads_as_json_loads_would(monkeypatch) -> None:
    raw = sglang_answer(LONG_TURN)
    assert len(raw) > 2_000_000
    loads = LargestCall(json.loads)
    monkeypatch.setattr(wire_json.json, "loads", loads)
    parsed = loads_in_pieces(raw)
    monkeypatch.undo()
    assert parsed == json.loads(raw)
    # No call over more than a piece (and its brackets): the rest of the answer is small.
    assert loads.largest <= PIECE_BYTES + 256
    entries = parsed["meta_info"]["output_token_logprobs"]
    # One flat list, not a list per token for the garbage collector to walk.
    assert isinstance(entries, Rows) and entries.width == 3
    assert len(entries.values) == 3 * LONG_TURN and entries[5] == [-5.25, 39746, None]
    assert isinstance(parsed["output_ids"], list) and len(parsed["output_ids"]) == LONG_TURN


@pytest.mark.parametrize(
    "raw",
    [
        sglang_answer(20_000, indent=1),
        # Rows of unequal width, a nested row, a string inside: lists, as json.loads makes.
        sglang_answer(20_000).replace(b"[-0.25,", b"[-0.25,7,", 1),
        sglang_answer(20_000).replace(b"[-3.25,", b"[[-3.25],", 1),
        sglang_answer(20_000).replace(b"[-2.25,", b'[-2.25,"x",', 1),
        # A "key" inside a long string value: the string stays whole.
        json.dumps({"text": '": [' + "1," * 40_000 + '1]", "n": [1]'}).encode(),
        json.dumps({"a": [1] * 30_000, "b": {"c": [[1, 2]] * 20_000, "d": []}}).encode(),
    ],
    ids=["pretty", "wider-row", "nested-row", "string-in-row", "key-in-string", "several"],
)
def test_answers_of_any_shape_read_as_json_loads_would(raw: bytes) -> None:
    assert loads_in_pieces(raw) == json.loads(raw)


@pytest.mark.parametrize(
    "raw",
    [
        sglang_answer(20_000)[:-40],
        sglang_answer(20_000).replace(b"null]]", b"null],]"),
        sglang_answer(20_000).replace(b"null],[", b"null],,[", 1),
        sglang_answer(20_000).replace(b"null],[", b"nul],[", 1),
        b"\xff" + sglang_answer(20_000),
    ],
    ids=["cut", "trailing-comma", "double-comma", "bad-literal", "not-utf8"],
)
def test_a_broken_answer_fails_as_json_loads_fails(raw: bytes) -> None:
    with pytest.raises(ValueError) as ours:
        loads_in_pieces(raw)
    with pytest.raises(ValueError) as theirs:
        json.loads(raw.decode("utf-8"))
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)


def test_a_long_turn_is_decoded_read_and_checked_off_the_loop(tokenizer, monkeypatch) -> None:
    """A 109K-token SGLang answer through the adapter: the answer decoded and read into a
    `Generation` in one worker call (its per-token tree is made and freed there), the
    generation's check in a worker too; the loop thread does none of it."""
    ids = [(k * 7919 + 151) % 151_000 for k in range(LONG_TURN)] + [IM_END]
    threads: dict[str, set[int]] = {"decode": set(), "read": set(), "check": set()}

    def recorded(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            threads[name].add(threading.get_ident())
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(
        "tokentrail.engines.http.loads_in_pieces", recorded("decode", loads_in_pieces)
    )
    monkeypatch.setattr(
        sglang_module,
        "parse_generate_response",
        recorded("read", sglang_module.parse_generate_response),
    )
    monkeypatch.setattr(
        turns_module, "check_generation", recorded("check", turns_module.check_generation)
    )

    async def go() -> tuple[int, int, int]:
        loop_thread = threading.get_ident()
        reply = (ids, [-0.5] * len(ids), "stop")
        async with FakeSGLang(lambda _prompt: reply) as fake:
            adapter = Adapter(engine=SGLangEngine(fake.url, tokenizer), tokenizer=tokenizer)
            runner, url = await start_server(adapter)
            try:
                client = anthropic.AsyncAnthropic(base_url=url, api_key="long", max_retries=0)
                async with client.messages.stream(
                    model="m",
                    max_tokens=LONG_TURN + 10,
                    messages=[{"role": "user", "content": "Write it all out."}],
                ) as stream:
                    message = await stream.get_final_message()
            finally:
                await runner.cleanup()
        return loop_thread, message.usage.output_tokens, adapter.manager.turn_count("long")

    loop_thread, output_tokens, recorded_turns = asyncio.run(go())
    assert output_tokens == LONG_TURN + 1 and recorded_turns == 1
    assert all(threads.values()), threads
    assert loop_thread not in threads["decode"] | threads["read"] | threads["check"]
    # Decoded and read in one call: the tree never crosses to the loop, and dies in the worker.
    assert threads["decode"] == threads["read"]


# -- an image's request -------------------------------------------------------------------------


def image_request(data: str, *, spaced: bool = True) -> bytes:
    source = {"type": "base64", "media_type": "image/png", "data": data}
    content = [{"type": "text", "text": "What is in it?"}, {"type": "image", "source": source}]
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": content}]}
    separators = None if spaced else (",", ":")
    return json.dumps(body, separators=separators).encode()


def test_an_images_base64_is_never_parsed_in_one_call(monkeypatch) -> None:
    data = base64.b64encode(bytes(range(256)) * 80_000).decode()  # 27 MB, a 20 MB image's
    decoder = msgspec.json.Decoder()
    seen = LargestCall(decoder.decode)
    monkeypatch.setattr(parse, "_DECODER", type("D", (), {"decode": staticmethod(seen)}))
    for spaced in (True, False):
        raw = image_request(data, spaced=spaced)
        parsed = parse_reusing(raw, ANTHROPIC, None, 64)
        assert parsed.body == json.loads(raw)
        assert parsed.body["messages"][0]["content"][1]["source"]["data"] == data
    assert seen.largest < 1000


@pytest.mark.parametrize(
    "body",
    [
        # A long string that follows a string ending in `": "`: not a value of a key.
        {"a": ["x: ", "y" * (lift.LIFT_BYTES + 10)]},
        {"a": 'say ": "' + "z" * (lift.LIFT_BYTES + 10)},
        {"a": "ends in a backslash \\", "data": "q" * (lift.LIFT_BYTES + 10)},
        {"a": "escaped \\n inside " + "r" * (lift.LIFT_BYTES + 10)},
        {"a": "é" * (lift.LIFT_BYTES + 10), "b": [{"c": "s" * (lift.LIFT_BYTES + 1)}]},
    ],
    ids=["in-array", "quote-colon-in-string", "backslash-before-key", "escape", "unicode"],
)
def test_bodies_with_long_strings_parse_as_the_parser_would(body: dict[str, Any]) -> None:
    for raw in (json.dumps(body).encode(), json.dumps(body, ensure_ascii=False).encode()):
        assert lift.decode_lifting(raw, msgspec.json.decode) == json.loads(raw)


def test_a_broken_long_string_is_refused_as_the_parser_refuses_it() -> None:
    raw = json.dumps({"data": "a" * (lift.LIFT_BYTES + 10)}).encode()
    for broken in (raw.replace(b"aaaa", b"\xff\xfe", 1), raw[:-2]):
        with pytest.raises(msgspec.DecodeError) as ours:
            lift.decode_lifting(broken, msgspec.json.decode)
        with pytest.raises(msgspec.DecodeError) as theirs:
            msgspec.json.decode(broken)
        assert str(ours.value) == str(theirs.value)


def test_base64_of_an_image_is_made_and_read_a_piece_at_a_time(monkeypatch) -> None:
    image = bytes(range(256)) * 80_000 + b"tail"
    encode = LargestCall(base64.b64encode)
    monkeypatch.setattr("tokentrail.messages.base64.b64encode", encode)
    text = b64encode_in_pieces(image)
    monkeypatch.undo()
    assert text == base64.b64encode(image).decode()
    assert encode.largest <= 3 << 16
    decode = LargestCall(base64.b64decode)
    monkeypatch.setattr("tokentrail.text.vision.base64.b64decode", decode)
    assert b64decode_in_pieces(text) == image
    assert decode.largest <= 1 << 18


def test_a_large_body_is_read_whole_and_joined_off_the_loop(monkeypatch) -> None:
    """A 27 MB body over a real socket, arriving in many reads: read exactly, its pieces
    joined in a worker (not grown and copied on the loop); a body without a length that grows
    past the limit is refused as one with a length is."""
    joins: list[int] = []
    to_thread = asyncio.to_thread

    async def recording(fn: Any, *args: Any) -> Any:
        joins.append(len(args[0]))
        return await to_thread(fn, *args)

    monkeypatch.setattr(read.asyncio, "to_thread", recording)
    raw = image_request(base64.b64encode(bytes(range(256)) * 80_000).decode())
    limit = 32 * 1024 * 1024
    got: list[bytes | str] = []

    async def handler(request: web.Request) -> web.Response:
        try:
            got.append(await read.read_body(request, max_bytes=limit, timeout_s=60))
        except RequestTooLarge as exc:
            got.append(str(exc))
        return web.Response(text="ok")

    async def pieces(body: bytes) -> Any:
        for at in range(0, len(body), 1 << 16):
            yield body[at : at + (1 << 16)]

    async def go() -> None:
        app = web.Application(client_max_size=limit)
        app.router.add_post("/", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as http:
                for body in (raw, pieces(raw + b" " * (limit - len(raw) + 1))):
                    async with http.post(f"http://127.0.0.1:{port}/", data=body) as resp:
                        await resp.read()
        finally:
            await runner.cleanup()

    asyncio.run(go())
    assert got[0] == raw
    assert joins and joins[0] > 100  # the body came in many reads, joined in a worker
    assert isinstance(got[1], str) and f"over {limit} bytes" in got[1]


class RecordingTokenizer:
    """A `tokenizers.Tokenizer` that says which of its decodes was called."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        self.calls.append("decode")
        return str(self.inner.decode(ids, skip_special_tokens=skip_special_tokens))

    def decode_batch(self, batch: list[list[int]], skip_special_tokens: bool) -> list[str]:
        self.calls.append("decode_batch")
        return list(self.inner.decode_batch(batch, skip_special_tokens=skip_special_tokens))


def test_a_long_turns_text_is_decoded_where_the_interpreter_is_let_go(
    tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `tokenizers` holds the GIL through `decode` (47 ms for a 109K-token turn). A byte-level
    # vocabulary's text comes from the core's table; any other from `decode_batch`, which
    # lets go of it: the very same text.
    monkeypatch.setattr(detokenize, "VERIFY_DECODE", False)
    recording = RecordingTokenizer(tokenizer.tokenizer)
    loaded = dataclasses.replace(tokenizer, tokenizer=recording)
    ids = [(k * 7919 + 151) % 151_000 for k in range(LONG_TURN)] + [IM_END]
    want = tokenizer.tokenizer.decode(ids, skip_special_tokens=False)
    assert loaded.decode(ids) == want
    assert recording.calls == []  # the core's table
    object.__setattr__(loaded, "_detokenizer", (loaded.vocab_size, None))  # not byte-level
    assert loaded.decode(ids) == want
    assert loaded.decode(ids[:100]) == tokenizer.tokenizer.decode(
        ids[:100], skip_special_tokens=False
    )
    assert recording.calls == ["decode_batch", "decode"]


def test_the_cores_decode_of_a_long_turn_lets_the_interpreter_go(tokenizer) -> None:
    # With a long switch interval another thread runs only when the interpreter is let go:
    # it counts while the core decodes 2M ids (an array: no list to read with it held).
    detokenizer = tokenizer.detokenizer()
    assert detokenizer is not None
    ids = np.arange(2_000_000, dtype=np.uint32) % 151_000
    counted = [0]
    stop = threading.Event()

    def count() -> None:
        while not stop.is_set():
            counted[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.05)
    thread = threading.Thread(target=count)
    try:
        thread.start()
        before = counted[0]
        text = detokenizer.decode(ids)
        during = counted[0] - before
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert len(text) > 2_000_000
    assert during > 0
