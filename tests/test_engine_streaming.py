"""Engine streaming: the SGLang and vLLM clients reading `stream: true` answers from stand-ins
that stream as the real engines do (SGLang's cumulative default and
`--incremental-streaming-output`; vLLM's delta chunks with `token_ids`, the terminal chunk's
`weight_versions`, the usage chunk), over real sockets.

What is captured from the stream equals the non-streamed answer for the same sampled tokens:
ids, logprobs, finish reason, prompt count, weight versions and replay rows, for every event
size; the tokens reach the sink in order as they arrive; a mid-stream error, an oversized event,
a runaway stream and a stream cut short are refused by name; an abort keeps what was streamed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.fake_engines import IM_END, FakeSGLang, FakeVLLM
from tokentrail.core.routing import IndexerShape, RoutingShape
from tokentrail.engines import GenerateRequest, Generation, ReplayRequest, SamplingParams
from tokentrail.engines.sglang import SGLangEngine
from tokentrail.engines.streaming import StreamingEngine
from tokentrail.engines.vllm import VLLMEngine
from tokentrail.errors import EngineError, EngineOutputError
from tokentrail.kinds import EngineFault
from tokentrail.sim.moe import KVRouting

PROMPT = [151644, 872, 9707, 1879, 13]
SHAPE = RoutingShape(4, 2, 16)
INDEXER = IndexerShape(2, 4)

# (stand-in, client, stand-in options): the three stream shapes the clients take.
WIRES: dict[str, tuple[type, type, dict[str, Any]]] = {
    "sglang-cumulative": (FakeSGLang, SGLangEngine, {}),
    "sglang-incremental": (FakeSGLang, SGLangEngine, {"incremental": True}),
    "vllm": (FakeVLLM, VLLMEngine, {}),
}


def sampled(n: int, seed: int) -> tuple[list[int], list[float]]:
    """`n` tokens ending with `<|im_end|>`, with logprobs of every float shape (tiny, exact
    zero, long mantissas) so a lossy round trip would show."""
    rng = random.Random(seed)
    ids = [rng.randrange(151643) for _ in range(n - 1)] + [IM_END]
    logprobs = [-rng.random() * 10 ** rng.randint(-12, 1) for _ in range(n)]
    logprobs[0] = 0.0
    return ids, logprobs


def reply_of(ids: list[int], logprobs: list[float]) -> Callable[[list[int]], Any]:
    return lambda _prompt: (list(ids), list(logprobs), "stop")


def request(rid: str, max_new: int = 4096, replay: ReplayRequest | None = None) -> GenerateRequest:
    return GenerateRequest(
        input_ids=list(PROMPT),
        sampling=SamplingParams(max_new_tokens=max_new, temperature=1.0),
        session_id="s-stream",
        request_id=rid,
        replay=replay or ReplayRequest(),
    )


def both_ways(
    wire: str, ids: list[int], logprobs: list[float], step: int, **options: Any
) -> tuple[Generation, Generation, list[tuple[list[int], list[float]]], Any]:
    """The same sampled tokens generated whole and streamed `step` tokens an event; the
    streamed generation, the whole one, the runs the sink got, the stand-in."""
    fake_cls, client_cls, extra = WIRES[wire]
    replay = options.pop("replay", None)

    async def go() -> Any:
        fake = fake_cls(reply_of(ids, logprobs), tokens_per_event=step, **extra, **options)
        async with fake as srv:
            engine = client_cls(srv.url)
            runs: list[tuple[list[int], list[float]]] = []
            whole = await engine.generate(request("whole", replay=replay))
            streamed = await engine.generate_streaming(
                request("streamed", replay=replay), lambda i, lp: runs.append((list(i), list(lp)))
            )
            await engine.close()
            return streamed, whole, runs, srv

    return asyncio.run(go())


def assert_same(streamed: Generation, whole: Generation) -> None:
    assert streamed.output_ids == whole.output_ids
    # Bit-for-bit: the floats that reach the journal are the same floats.
    assert np.array_equal(
        np.asarray(streamed.logprobs, np.float64).view(np.uint64),
        np.asarray(whole.logprobs, np.float64).view(np.uint64),
    )
    assert streamed.finish_reason == whole.finish_reason
    assert streamed.prompt_tokens == whole.prompt_tokens
    assert streamed.weight_versions == whole.weight_versions
    for a, b in (
        (streamed.routed_experts, whole.routed_experts),
        (streamed.indexer_topk, whole.indexer_topk),
    ):
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert a.gap == b.gap and a.start == b.start
            assert (a.rows is None) == (b.rows is None)
            if a.rows is not None and b.rows is not None:
                assert a.rows.dtype == b.rows.dtype
                assert np.array_equal(a.rows, b.rows)


@pytest.mark.parametrize("wire", list(WIRES))
@pytest.mark.parametrize("step", [1, 7, 64])
def test_a_streamed_turn_equals_the_whole_one(wire: str, step: int) -> None:
    ids, logprobs = sampled(300, seed=step)
    streamed, whole, runs, srv = both_ways(wire, ids, logprobs, step)
    assert_same(streamed, whole)
    assert whole.output_ids == ids
    # The tokens reached the sink in order, as whole events: the first event alone (the
    # harness hears it at once), then the events of each read together, in one run.
    assert [t for run, _ in runs for t in run] == ids
    assert len(runs[0][0]) == min(step, 300)
    ends = np.cumsum([len(run) for run, _ in runs])
    assert all(end % step == 0 or end == 300 for end in ends)
    assert len(srv.streamed["streamed"]) >= len(runs)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    wire=st.sampled_from(list(WIRES)),
    n=st.integers(1, 40),
    step=st.integers(1, 9),
    seed=st.integers(0, 2**16),
)
def test_streaming_equals_whole_on_generated_turns(wire: str, n: int, step: int, seed: int) -> None:
    ids, logprobs = sampled(n, seed)
    streamed, whole, runs, _ = both_ways(wire, ids, logprobs, step)
    assert_same(streamed, whole)
    assert [t for run, _ in runs for t in run] == ids


def test_sglang_streams_routed_experts_and_indexer_rows_like_the_whole_answer() -> None:
    ids, logprobs = sampled(50, seed=3)
    replay = ReplayRequest(routed_start=2, routing=SHAPE, indexer=INDEXER)
    for incremental in (False, True):
        streamed, whole, _, _ = both_ways(
            "sglang-cumulative",
            ids,
            logprobs,
            5,
            replay=replay,
            routing=KVRouting(SHAPE),
            indexer=INDEXER,
            incremental=incremental,
        )
        assert streamed.routed_experts is not None and streamed.routed_experts.rows is not None
        assert streamed.indexer_topk is not None and streamed.indexer_topk.rows is not None
        assert_same(streamed, whole)


def test_vllm_asked_for_routed_experts_generates_whole_and_still_feeds_the_sink() -> None:
    ids, logprobs = sampled(20, seed=4)
    replay = ReplayRequest(routed_start=0, routing=SHAPE)
    streamed, whole, runs, srv = both_ways(
        "vllm", ids, logprobs, 3, replay=replay, routing=KVRouting(SHAPE)
    )
    assert_same(streamed, whole)
    assert streamed.routed_experts is not None and streamed.routed_experts.rows is not None
    assert runs == [(ids, streamed.logprobs)]
    assert all(not b.get("stream") for b in srv.bodies("/v1/completions"))


@pytest.mark.parametrize("client_cls", [SGLangEngine, VLLMEngine])
def test_stream_switch_makes_generate_stream(client_cls: type) -> None:
    fake_cls = FakeSGLang if client_cls is SGLangEngine else FakeVLLM
    path = "/generate" if client_cls is SGLangEngine else "/v1/completions"
    ids, logprobs = sampled(10, seed=5)

    async def go() -> Any:
        async with fake_cls(reply_of(ids, logprobs)) as srv:
            engine = client_cls(srv.url, stream=True)
            assert isinstance(engine, StreamingEngine)
            gen = await engine.generate(request("r"))
            await engine.close()
            return gen, srv

    gen, srv = asyncio.run(go())
    assert gen.output_ids == ids
    body = srv.bodies(path)[-1]
    assert body["stream"] is True
    if client_cls is VLLMEngine:
        assert body["stream_options"] == {"include_usage": True}
        assert body["return_token_ids"] is True and body["logprobs"] == 0


@pytest.mark.parametrize("incremental", [False, True])
def test_a_cumulative_sglang_stream_is_said_once_with_the_flag_that_fixes_it(
    incremental: bool, caplog: pytest.LogCaptureFixture
) -> None:
    ids, logprobs = sampled(30, seed=6)

    async def go() -> list[Generation]:
        async with FakeSGLang(reply_of(ids, logprobs), incremental=incremental) as srv:
            engine = SGLangEngine(srv.url, stream=True)
            gens = [await engine.generate(request(f"r{i}")) for i in range(3)]
            await engine.close()
            return gens

    with caplog.at_level("WARNING", logger="tokentrail.engines.sglang"):
        gens = asyncio.run(go())
    assert all(gen.output_ids == ids for gen in gens)
    said = [r.getMessage() for r in caplog.records if "streams cumulatively" in r.getMessage()]
    if incremental:
        assert said == []
    else:
        assert len(said) == 1, said
        assert "--incremental-streaming-output" in said[0]


def run_stream(fake: Any, client_cls: type, req: GenerateRequest) -> Any:
    async def go() -> Any:
        async with fake as srv:
            engine = client_cls(srv.url)
            try:
                return await engine.generate_streaming(req, lambda i, lp: None)
            finally:
                await engine.close()

    return asyncio.run(go())


@pytest.mark.parametrize("wire", list(WIRES))
def test_a_runaway_stream_is_refused_as_too_long(wire: str) -> None:
    fake_cls, client_cls, extra = WIRES[wire]
    ids, logprobs = sampled(40, seed=6)
    fake = fake_cls(reply_of(ids, logprobs), truncate=False, **extra)
    with pytest.raises(EngineOutputError) as info:
        run_stream(fake, client_cls, request("r", max_new=8))
    assert info.value.fault is EngineFault.TOO_LONG


@pytest.mark.parametrize("wire", list(WIRES))
def test_an_event_over_the_bound_is_refused_unread(wire: str) -> None:
    fake_cls, client_cls, extra = WIRES[wire]
    # Eight tokens may take ~1.1 MiB (`answer_limit`); an event of 3 MiB cannot be an answer.
    ids, logprobs = sampled(8, seed=7)

    async def go() -> Any:
        fake = fake_cls(reply_of(ids, logprobs), **extra)
        async with fake as srv:
            original = srv._stream

            async def padded(request: Any, rid: str, n: int, event: Any, *rest: Any) -> Any:
                def fat(a: int, b: int, last: bool) -> Any:
                    obj = event(a, b, last)
                    obj["pad"] = "x" * (3 << 20)
                    return obj

                return await original(request, rid, n, fat, *rest)

            srv._stream = padded
            engine = client_cls(srv.url)
            try:
                return await engine.generate_streaming(request("r", max_new=8), lambda i, lp: None)
            finally:
                await engine.close()

    with pytest.raises(EngineOutputError) as info:
        asyncio.run(go())
    assert info.value.fault is EngineFault.TOO_LONG


@pytest.mark.parametrize("wire", list(WIRES))
def test_an_error_event_after_the_200_is_the_engines_message(wire: str) -> None:
    fake_cls, client_cls, extra = WIRES[wire]
    ids, logprobs = sampled(8, seed=8)

    async def go() -> Any:
        async with fake_cls(reply_of(ids, logprobs), **extra) as srv:
            original = srv._stream

            async def failing(request: Any, rid: str, n: int, event: Any, *rest: Any) -> Any:
                def broken(a: int, b: int, last: bool) -> Any:
                    if a >= 3:
                        return {
                            "error": {
                                "message": "CUDA error: an illegal memory access",
                                "type": "InternalServerError",
                                "code": 500,
                            }
                        }
                    return event(a, b, last)

                return await original(request, rid, n, broken, *rest)

            srv._stream = failing
            engine = client_cls(srv.url)
            try:
                return await engine.generate_streaming(request("r"), lambda i, lp: None)
            finally:
                await engine.close()

    with pytest.raises(EngineError, match="illegal memory access"):
        asyncio.run(go())


@pytest.mark.parametrize("wire", list(WIRES))
def test_a_stream_cut_before_its_last_event_is_an_error(wire: str) -> None:
    fake_cls, client_cls, extra = WIRES[wire]
    ids, logprobs = sampled(8, seed=9)

    async def go() -> Any:
        async with fake_cls(reply_of(ids, logprobs), **extra) as srv:
            original = srv._stream

            async def cut(request: Any, rid: str, n: int, event: Any, *rest: Any) -> Any:
                return await original(
                    request, rid, n - 2, lambda a, b, _last: event(a, b, False), *rest
                )

            srv._stream = cut
            engine = client_cls(srv.url)
            try:
                return await engine.generate_streaming(request("r"), lambda i, lp: None)
            finally:
                await engine.close()

    with pytest.raises(EngineError, match="finish_reason"):
        asyncio.run(go())


@pytest.mark.parametrize("wire", list(WIRES))
def test_an_abort_mid_stream_keeps_what_was_streamed(wire: str) -> None:
    fake_cls, client_cls, extra = WIRES[wire]
    ids, logprobs = sampled(30, seed=10)

    async def go() -> Any:
        async with fake_cls(
            reply_of(ids, logprobs), stall_at=12, tokens_per_event=4, **extra
        ) as srv:
            engine = client_cls(srv.url)
            got: list[int] = []
            task = asyncio.ensure_future(
                engine.generate_streaming(request("rid-9"), lambda i, lp: got.extend(i))
            )
            while len(got) < 12:
                await asyncio.sleep(0.01)
            await engine.abort("rid-9")
            gen = await asyncio.wait_for(task, 10)
            await engine.close()
            return gen, srv

    gen, srv = asyncio.run(go())
    assert gen.finish_reason == "abort"
    assert gen.output_ids == ids[:12]
    assert gen.logprobs == logprobs[:12]
    if client_cls is SGLangEngine:
        assert srv.aborted == ["rid-9"]


@pytest.mark.parametrize("wire", list(WIRES))
def test_a_cancelled_stream_stops_the_engine_request(wire: str) -> None:
    fake_cls, client_cls, extra = WIRES[wire]
    ids, logprobs = sampled(30, seed=11)

    async def go() -> Any:
        async with fake_cls(reply_of(ids, logprobs), stall_at=5, **extra) as srv:
            engine = client_cls(srv.url)
            got: list[int] = []
            task = asyncio.ensure_future(
                engine.generate_streaming(request("rid-c"), lambda i, lp: got.extend(i))
            )
            while len(got) < 5:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await engine.close()
            for _ in range(200):
                if getattr(srv, "aborted", None) or srv.disconnected:
                    break
                await asyncio.sleep(0.01)
            return srv

    srv = asyncio.run(go())
    if client_cls is SGLangEngine:
        assert srv.aborted == ["rid-c"]
    else:
        assert srv.disconnected == ["rid-c"]
