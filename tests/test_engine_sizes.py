"""The engine boundary at the sizes the field runs at, over real sockets.

The stand-in engines (tests/support/fake_engines.py) speak SGLang's and vLLM's wire formats and
send their answers in one write, in many small pieces, with chunked transfer encoding or
trickled: vLLM echoing a 128K-token prompt, SGLang routing at Qwen3-30B-A3B's shape (48 layers
x top-8 of 128) for a 64K-token prompt, vLLM's `.npy` routing at the same size, an indexer
top-k at a DeepSeek-V3.2-like width; and answers at the bound the request sets, and one byte
over it (refused, the engine request aborted, nothing recorded).
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import socket
from typing import Any

import anthropic
import numpy as np
import pytest

from support.fake_engines import IM_END, FakeSGLang, FakeVLLM
from tokentrail import TrajectoryManager
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.core.routing import IndexerShape, RoutingShape
from tokentrail.engines import GenerateRequest, ReplayRequest, SamplingParams
from tokentrail.engines.bound import answer_limit
from tokentrail.engines.sglang import SGLangEngine
from tokentrail.engines.vllm import VLLMEngine
from tokentrail.errors import EngineError, EngineOutputError
from tokentrail.kinds import EngineFault
from tokentrail.sim.moe import KVRouting
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer

# What the stand-in samples: two ids and the end of turn.
OUT_A, OUT_B = 40, 1079
SAMPLED = [OUT_A, OUT_B, IM_END]
K128, K64 = 128 * 1024, 64 * 1024
QWEN3_MOE = RoutingShape(48, 8, 128)
# DeepSeek V3.2's indexer keeps index_topk=2048 per position; three indexer layers here.
V32_INDEXER = IndexerShape(3, 2048)


@pytest.fixture(scope="module")
def tokenizer() -> LoadedTokenizer:
    return load_tokenizer("builtin:qwen3")


def sampled(input_ids: list[int]) -> tuple[list[int], list[float], str]:
    return list(SAMPLED), [-0.25, -1.5, -0.0625], "stop"


def prompt(n: int) -> list[int]:
    """`n` ids spread over Qwen3's vocabulary (six-digit ones among them, as in real text)."""
    return ((np.arange(n, dtype=np.int64) * 7919 + 151) % 151_000).tolist()


def request(
    ids: list[int], replay: ReplayRequest | None = None, max_new_tokens: int = 64
) -> GenerateRequest:
    return GenerateRequest(
        input_ids=ids,
        sampling=SamplingParams(max_new_tokens=max_new_tokens),
        session_id="big",
        request_id="req-big",
        replay=replay or ReplayRequest(),
    )


def generate(fake: Any, engine_cls: type, req: GenerateRequest) -> Any:
    async def go() -> Any:
        async with fake as srv:
            engine = engine_cls(srv.url)
            try:
                return await engine.generate(req)
            finally:
                await engine.close()

    return asyncio.run(go())


DELIVERIES = [
    {"delivery": "whole"},
    {"delivery": "pieces", "piece_bytes": 4096},
    {"delivery": "chunked", "piece_bytes": 4096},
    {"delivery": "chunked", "piece_bytes": 64 * 1024, "trickle_s": 0.002},
]


@pytest.mark.parametrize("how", DELIVERIES, ids=lambda h: "-".join(map(str, h.values())))
def test_vllm_answer_echoing_a_128k_token_prompt_is_read_whole(how: dict, caplog) -> None:
    ids = prompt(K128)
    fake = FakeVLLM(sampled, **how)
    with caplog.at_level(logging.WARNING):
        gen = generate(fake, VLLMEngine, request(ids))
    assert fake.sent_bytes[0] > 800_000  # the echoed prompt ids alone
    assert (gen.output_ids, gen.finish_reason, gen.prompt_tokens) == (SAMPLED, "stop", K128)
    assert "different" not in caplog.text  # the echo matched what was sent


def test_sglang_routing_at_48x8_for_a_64k_token_prompt() -> None:
    ids = prompt(K64)
    kv = KVRouting(QWEN3_MOE)
    fake = FakeSGLang(sampled, routing=kv, delivery="pieces", piece_bytes=256 * 1024)
    replay = ReplayRequest(routed_start=0, routing=QWEN3_MOE)
    gen = generate(fake, SGLangEngine, request(ids, replay))
    assert fake.sent_bytes[0] > 130_000_000  # ~100 MB of int32 rows as base64
    rows = gen.routed_experts.rows
    assert rows.shape == (K64 + len(SAMPLED) - 1, 48, 8)
    assert rows.dtype == np.uint8  # the store's type, decoded into directly
    assert np.array_equal(rows, fake.routed_rows[0])
    assert gen.output_ids == SAMPLED


def test_vllm_npy_routing_at_48x8_for_a_64k_token_prompt() -> None:
    ids = prompt(K64)
    kv = KVRouting(QWEN3_MOE)
    fake = FakeVLLM(sampled, routing=kv, delivery="chunked", piece_bytes=256 * 1024)
    replay = ReplayRequest(routed_start=0, routing=QWEN3_MOE)
    gen = generate(fake, VLLMEngine, request(ids, replay))
    sent = np.load(io.BytesIO(base64.b64decode(_choice(fake)["routed_experts"])))
    assert gen.routed_experts.rows.shape == (K64 + len(SAMPLED) - 1, 48, 8)
    assert np.array_equal(gen.routed_experts.rows, sent)


def _choice(fake: FakeVLLM) -> dict:
    return fake.answered[0]["choices"][0]


def test_indexer_topk_at_a_v32_like_width() -> None:
    ids = prompt(1024)
    fake = FakeSGLang(sampled, indexer=V32_INDEXER, delivery="pieces", piece_bytes=256 * 1024)
    gen = generate(fake, SGLangEngine, request(ids, ReplayRequest(indexer=V32_INDEXER)))
    sent = np.frombuffer(base64.b64decode(fake.answers[0]["indexer_topk"]), "<i4")
    rows = gen.indexer_topk.rows
    assert rows.shape == (1024 + len(SAMPLED) - 1, 3, 2048)
    assert np.array_equal(rows.reshape(-1), sent)


@pytest.mark.parametrize("delivery", ["whole", "chunked"])
@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_an_answer_at_the_bound_is_read_and_one_byte_more_is_refused(
    kind: str, delivery: str
) -> None:
    fake_cls, engine_cls = (
        (FakeSGLang, SGLangEngine) if kind == "sglang" else (FakeVLLM, VLLMEngine)
    )
    req = request(prompt(4096))
    bound = answer_limit(req, echoes_prompt=kind == "vllm")
    how = {"delivery": delivery, "piece_bytes": 64 * 1024}
    at = fake_cls(sampled, pad_to=bound, **how)
    assert generate(at, engine_cls, req).output_ids == SAMPLED
    assert at.sent_bytes == [bound]
    over = fake_cls(sampled, pad_to=bound + 1, **how)
    with pytest.raises(EngineOutputError, match=f"more than {bound} bytes") as info:
        generate(over, engine_cls, req)
    assert info.value.fault == EngineFault.TOO_LONG


def test_the_bound_counts_echoed_prompt_ids_and_replay_rows() -> None:
    ids = prompt(K128)
    plain = answer_limit(request(ids))
    # vLLM's echo: up to 12 bytes an id.
    assert answer_limit(request(ids), echoes_prompt=True) - plain >= 12 * K128
    routed = answer_limit(request(ids, ReplayRequest(routed_start=0, routing=QWEN3_MOE)))
    rows = (K128 + 64) * 48 * 8 * 4
    assert routed - plain >= rows * 4 // 3
    # From a later start, only the rows from there on.
    later_request = request(ids, ReplayRequest(routed_start=K64, routing=QWEN3_MOE))
    later = answer_limit(later_request)
    assert later < routed - (K64 * 48 * 8 * 4 * 4 // 3)
    # Unless the engine may send them from position 0 anyway.
    assert answer_limit(later_request, honours_start=False) == routed


def test_an_sglang_that_ignores_the_start_is_read_within_the_bound() -> None:
    """SGLang 0.5.9 to 0.5.11 send every position's rows on a later turn too: a long prompt's
    rows are still a legitimate answer."""
    ids = prompt(4096)
    kv = KVRouting(QWEN3_MOE)
    fake = FakeSGLang(sampled, routing=kv, ignores_routing_start=True)
    replay = ReplayRequest(routed_start=4000, routing=QWEN3_MOE)
    gen = generate(fake, SGLangEngine, request(ids, replay))
    assert fake.sent_bytes[0] > answer_limit(request(ids, replay))  # as if it honoured it
    rows = gen.routed_experts.rows
    assert gen.routed_experts.start == 4000
    assert np.array_equal(rows, fake.routed_rows[0][4000:])


def test_an_engine_that_is_down_is_an_error_naming_its_url() -> None:
    async def go() -> None:
        engine = VLLMEngine("http://127.0.0.1:9", model="m", timeout=5)
        try:
            await engine.generate(request([1, 2, 3]))
        finally:
            await engine.close()

    # Its first call asks for the weights' version (`/weight_info`), then the completion.
    with pytest.raises(EngineError, match=r"cannot reach vllm at http://127\.0\.0\.1:9/"):
        asyncio.run(go())


def test_an_answer_over_the_bound_is_a_502_with_the_engine_aborted_and_nothing_recorded(
    tokenizer, caplog
) -> None:
    max_tokens = 64
    # Without replay SGLang's bound does not depend on the prompt.
    bound = answer_limit(request([], max_new_tokens=max_tokens))

    async def go() -> tuple[anthropic.APIStatusError, FakeSGLang, Adapter]:
        over = FakeSGLang(sampled, pad_to=bound + 1, delivery="chunked", piece_bytes=64 * 1024)
        async with over as fake:
            adapter = Adapter(engine=SGLangEngine(fake.url, tokenizer), tokenizer=tokenizer)
            runner, url = await start_server(adapter)
            try:
                client = anthropic.AsyncAnthropic(base_url=url, api_key="big-one", max_retries=0)
                with pytest.raises(anthropic.APIStatusError) as info:
                    await client.messages.create(
                        model="m",
                        max_tokens=max_tokens,
                        messages=[{"role": "user", "content": "hi"}],
                    )
            finally:
                await runner.cleanup()
            return info.value, fake, adapter

    with caplog.at_level(logging.WARNING):
        error, fake, adapter = asyncio.run(go())
    assert error.status_code == 502
    assert error.body["type"] == "error" and error.body["error"]["type"] == "api_error"
    assert f"more than {bound} bytes" in error.body["error"]["message"]
    rid = fake.bodies("/generate")[0]["rid"]
    assert fake.aborted == [rid]
    assert adapter.manager.turn_count("big-one") == 0
    logged = [r for r in caplog.records if r.levelno == logging.WARNING and "502" in r.message]
    assert len(logged) == 1
    assert "big-one" in logged[0].message and rid in logged[0].message
    assert f"more than {bound} bytes" in logged[0].message


def test_a_routed_experts_session_at_48x8_trains_every_generated_token(tokenizer) -> None:
    """Three turns through the adapter over the SGLang stand-in at Qwen3-30B-A3B's shape, the
    first a long file pasted in (~10K tokens): every turn answered, every generated token
    trained, every token's routing carried as the engine computed it."""
    kv = KVRouting(QWEN3_MOE)
    pasted = "\n".join(f"def step_{i}(x):\n    return x * {i} + {i % 7}" for i in range(900))

    def reply(input_ids: list[int]) -> tuple[list[int], list[float], str]:
        ids = [*tokenizer.encode(f"Read {len(input_ids)} tokens; done."), IM_END]
        return ids, [-0.25] * len(ids), "stop"

    async def go() -> Any:
        async with FakeSGLang(reply, routing=kv, delivery="chunked", piece_bytes=64 * 1024) as fake:
            adapter = Adapter(
                engine=SGLangEngine(fake.url, tokenizer),
                tokenizer=tokenizer,
                manager=TrajectoryManager(routing=QWEN3_MOE),
                config=AdapterConfig(routed_experts=True),
            )
            runner, url = await start_server(adapter)
            try:
                client = anthropic.AsyncAnthropic(base_url=url, api_key="moe", max_retries=0)
                messages: list[dict[str, Any]] = [
                    {"role": "user", "content": f"Review this file:\n{pasted}"}
                ]
                for k in range(3):
                    answer = await client.messages.create(
                        model="m", max_tokens=64, messages=messages
                    )
                    messages += [
                        {"role": "assistant", "content": answer.content[0].text},
                        {"role": "user", "content": f"and now part {k}"},
                    ]
                return await adapter.finish_trajectory("moe", reward=1.0), fake
            finally:
                await runner.cleanup()

    traj, fake = asyncio.run(go())
    assert len(fake.bodies("/generate")) == 3
    assert len(fake.bodies("/generate")[0]["input_ids"]) > 10_000
    ledger = traj.ledger
    assert ledger.generated_tokens > 0 and ledger.trained_tokens == ledger.generated_tokens
    coverage = ledger.replay["routed_experts"]
    assert coverage.complete
    (sample,) = traj.samples
    n = len(sample.tokens)
    held, _ = kv.rows_of(sample.tokens)
    assert sample.routed_experts.shape == (n, 48, 8)
    assert np.array_equal(sample.routed_experts[: n - 1], held[: n - 1])


def test_an_engine_that_never_takes_the_connection_is_an_error_naming_its_url() -> None:
    """A listening socket whose backlog is full drops the engine client's SYNs, as an engine
    host that is unreachable does: the client gives up after its connect timeout, not after the
    generation timeout."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        fillers = []
        for _ in range(4):  # fill the accept queue (nothing accepts)
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)

        async def go() -> None:
            engine = SGLangEngine(f"http://127.0.0.1:{port}", timeout=120)
            engine.connect_timeout = 0.5
            try:
                await engine.generate(request([1, 2, 3]))
            finally:
                await engine.close()

        try:
            with pytest.raises(EngineError, match=r"cannot reach sglang at .*no connection"):
                asyncio.run(asyncio.wait_for(go(), 60))
        finally:
            for filler in fillers:
                filler.close()
