"""Replay data on the wire: the SGLang and vLLM clients against fakes speaking their formats.

SGLang: `return_routed_experts` with `routed_experts_start_len` at the top level, rows back as
base64 little-endian int32 `[prompt + completion - 1 - start, layers, top_k]`; an old server
that ignores the start; a server without the flag; rows that do not fit the model; the indexer
top-k from position 0; `weight_version` and its spans. vLLM: a `.npy` per choice from
`routed_experts_prompt_start`, weight version spans, no indexer. And the model's shapes from
its `config.json`.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
from typing import Any

import numpy as np
import pytest

from support.fake_engines import FakeSGLang, FakeVLLM, b64_int32
from tokentrail.core.routing import (
    IndexerShape,
    ReplayRows,
    RoutingShape,
    WeightSpan,
    model_shapes,
    read_model_config,
)
from tokentrail.engines import GenerateRequest, ReplayRequest, SamplingParams
from tokentrail.engines.registry import create_engine
from tokentrail.engines.sglang import SGLangEngine, parse_generate_response
from tokentrail.engines.vllm import VLLMEngine
from tokentrail.errors import ReplayError
from tokentrail.kinds import ReplayGap
from tokentrail.sim.moe import KVRouting

# A prompt of five ids; the fake samples three more, the last its end token.
PROMPT = [11, 12, 13, 14, 15]
SAMPLED = [21, 22, 23]
SHAPE = RoutingShape(3, 2, 8)
INDEXER = IndexerShape(2, 4)


def reply(input_ids: list[int]) -> tuple[list[int], list[float], str]:
    return list(SAMPLED), [-0.5] * len(SAMPLED), "stop"


def request(start: int | None = 0, indexer: IndexerShape | None = None) -> GenerateRequest:
    return GenerateRequest(
        input_ids=list(PROMPT),
        sampling=SamplingParams(max_new_tokens=16),
        session_id="s",
        replay=ReplayRequest(routed_start=start, routing=SHAPE, indexer=indexer),
    )


def served(fake: Any, engine_cls: type, req: GenerateRequest) -> tuple[Any, Any]:
    async def go() -> Any:
        async with fake as srv:
            engine = engine_cls(srv.url)
            try:
                return await engine.generate(req), srv
            finally:
                await engine.close()

    return asyncio.run(go())


# --- SGLang ----------------------------------------------------------------------------------


def test_sglang_asks_at_the_top_level_and_reads_rows_from_the_start() -> None:
    kv = KVRouting(SHAPE)
    gen, srv = served(FakeSGLang(reply, routing=kv), SGLangEngine, request(start=2))
    (body,) = srv.bodies("/generate")
    assert body["return_routed_experts"] is True and body["routed_experts_start_len"] == 2
    assert "return_routed_experts" not in body["sampling_params"], "0.5.22+ refuses it there"
    assert "return_indexer_topk" not in body
    routed = gen.routed_experts
    # Positions 2..7 of the 8 tokens: the last sampled token was never fed forward.
    assert routed.start == 2 and routed.rows.shape == (5, 3, 2) and routed.gap is None
    held, _ = kv.rows_of(PROMPT + SAMPLED[:-1])
    assert routed.rows.tolist() == held[2:].tolist()
    assert gen.weight_versions == (WeightSpan("default", 0, 3),)


def test_sglang_start_is_clamped_to_the_prompt() -> None:
    _, srv = served(FakeSGLang(reply, routing=KVRouting(SHAPE)), SGLangEngine, request(start=9))
    assert srv.bodies("/generate")[0]["routed_experts_start_len"] == len(PROMPT)


def test_an_sglang_that_ignores_the_start_is_sliced_to_it() -> None:
    kv = KVRouting(SHAPE)
    fake = FakeSGLang(reply, routing=kv, ignores_routing_start=True)
    gen, _ = served(fake, SGLangEngine, request(start=3))
    held, _ = kv.rows_of(PROMPT + SAMPLED[:-1])
    assert gen.routed_experts.start == 3
    assert gen.routed_experts.rows.tolist() == held[3:].tolist()


def test_a_server_without_the_flag_returns_none(caplog) -> None:
    gen, _ = served(FakeSGLang(reply), SGLangEngine, request())
    assert gen.routed_experts == ReplayRows.missing(ReplayGap.ENGINE_RETURNED_NONE)
    assert "--enable-return-routed-experts" in caplog.text


def test_nothing_is_asked_when_replay_is_off() -> None:
    gen, srv = served(FakeSGLang(reply, routing=KVRouting(SHAPE)), SGLangEngine, request(None))
    assert "return_routed_experts" not in srv.bodies("/generate")[0]
    assert gen.routed_experts is None and gen.indexer_topk is None


def meta_with(routed: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": "r",
        "finish_reason": {"type": "stop", "matched": SAMPLED[-1]},
        "prompt_tokens": len(PROMPT),
        "output_token_logprobs": [[-0.5, t, None] for t in SAMPLED],
        "weight_version": "step-7",
        **extra,
    }
    if routed is not None:
        meta["routed_experts"] = routed
    return {"text": "", "output_ids": SAMPLED, "meta_info": meta}


def good_rows(n: int = 7) -> np.ndarray:
    """Rows for the 7 positions fed forward: 3 layers, two distinct experts of 8 each."""
    first = (np.arange(n)[:, None] + np.arange(3)[None, :]) % 7
    return np.stack([first, first + 1], axis=-1).astype(np.int32)


@pytest.mark.parametrize(
    "routed",
    [
        "not base64!",
        base64.b64encode(b"\x01\x02\x03").decode(),  # not a whole int32
        b64_int32(good_rows(6)),  # a row short
        b64_int32(good_rows() + 1),  # expert 8 of 8
        b64_int32(np.stack([good_rows()[..., 0]] * 2, axis=-1)),  # one expert twice
    ],
    ids=["not-base64", "odd-bytes", "row-short", "out-of-range", "repeated"],
)
def test_rows_that_do_not_fit_the_model_are_a_shape_mismatch(routed: str, caplog) -> None:
    gen = parse_generate_response(meta_with(routed), request(), 0.0)
    assert gen.routed_experts == ReplayRows.missing(ReplayGap.SHAPE_MISMATCH)
    assert gen.output_ids == SAMPLED, "the turn itself is fine"


def test_dense_layers_are_zeros_and_fit() -> None:
    rows = good_rows()
    rows[:, 0] = 0  # a dense first layer (first_k_dense_replace)
    gen = parse_generate_response(meta_with(b64_int32(rows)), request(), 0.0)
    assert gen.routed_experts.rows.tolist() == rows.tolist()


def test_weight_versions_come_from_the_spans_when_they_tile_the_output() -> None:
    spans = [{"version": "v1", "start": 0, "end": 2}, {"version": "v2", "start": 2, "end": 3}]
    gen = parse_generate_response(meta_with(weight_versions=spans), request(None), 0.0)
    assert gen.weight_versions == (WeightSpan("v1", 0, 2), WeightSpan("v2", 2, 3))
    gapped = [{"version": "v1", "start": 0, "end": 1}, {"version": "v2", "start": 2, "end": 3}]
    gen = parse_generate_response(meta_with(weight_versions=gapped), request(None), 0.0)
    assert gen.weight_versions == (WeightSpan("step-7", 0, 3),)


def test_sglang_indexer_topk_comes_from_position_zero() -> None:
    fake = FakeSGLang(reply, routing=KVRouting(SHAPE), indexer=INDEXER)
    gen, srv = served(fake, SGLangEngine, request(start=4, indexer=INDEXER))
    assert srv.bodies("/generate")[0]["return_indexer_topk"] is True
    topk = gen.indexer_topk
    assert topk.start == 0 and topk.rows.shape == (7, 2, 4) and topk.rows.dtype == np.int32
    assert topk.rows[0, 0].tolist() == [0, -1, -1, -1]
    assert gen.routed_experts.start == 4


def test_an_indexer_layer_count_the_model_lacks_is_a_shape_mismatch() -> None:
    rows = np.zeros((7, 2, 4), dtype=np.int32)
    data = meta_with(indexer_topk=b64_int32(rows), indexer_topk_num_layers=3)
    gen = parse_generate_response(data, request(None, indexer=INDEXER), 0.0)
    assert gen.indexer_topk == ReplayRows.missing(ReplayGap.SHAPE_MISMATCH)


# --- vLLM ------------------------------------------------------------------------------------


def test_vllm_reads_the_npy_rows_from_the_prompt_start() -> None:
    kv = KVRouting(SHAPE)
    fake = FakeVLLM(reply, routing=kv, weight_version="w3", dev_mode=True)
    gen, srv = served(fake, VLLMEngine, request(start=1, indexer=INDEXER))
    body = srv.bodies("/v1/completions")[0]
    # vLLM 0.32's /v1/completions has no `return_weight_versions` (it logs it as ignored).
    assert body["routed_experts_prompt_start"] == 1 and "return_weight_versions" not in body
    held, _ = kv.rows_of(PROMPT + SAMPLED[:-1])
    assert gen.routed_experts.start == 1
    assert gen.routed_experts.rows.tolist() == held[1:].tolist()
    assert gen.indexer_topk == ReplayRows.missing(ReplayGap.NOT_SUPPORTED)
    # From `GET /weight_info`, the same before and after the call.
    assert gen.weight_versions == (WeightSpan("w3", 0, 3),)


def test_vllm_without_weight_routes_samples_with_its_initial_weights() -> None:
    """A server without `VLLM_SERVER_DEV_MODE` serves no route that changes its weights: its
    version is vLLM's own name for the weights it started with, asked for once."""

    async def go() -> list[Any]:
        async with FakeVLLM(reply) as srv:
            engine = VLLMEngine(srv.url)
            try:
                return [await engine.generate(request(None)) for _ in range(2)]
            finally:
                await engine.close()

    for gen in asyncio.run(go()):
        assert gen.weight_versions == (WeightSpan("default", 0, 3),)


def test_vllm_weights_updated_during_a_turn_leave_its_versions_unknown() -> None:
    fake = FakeVLLM(reply, weight_version="step-1", dev_mode=True)

    class Updated(VLLMEngine):
        async def _generate_whole(self, req: GenerateRequest) -> Any:
            generation = await super()._generate_whole(req)
            fake.weight_version = "step-2"  # a trainer's /update_weight_version meanwhile
            return generation

    gen, _ = served(fake, Updated, request(None))
    assert gen.output_ids == SAMPLED and gen.weight_versions == ()


def test_vllm_without_the_flag_returns_none() -> None:
    gen, srv = served(FakeVLLM(reply), VLLMEngine, request(start=0))
    assert gen.routed_experts == ReplayRows.missing(ReplayGap.ENGINE_RETURNED_NONE)
    gen, srv = served(FakeVLLM(reply), VLLMEngine, request(start=None))
    assert "routed_experts_prompt_start" not in srv.bodies("/v1/completions")[0]
    assert gen.routed_experts is None


# --- the model's shapes ----------------------------------------------------------------------

QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "num_hidden_layers": 48,
    "num_experts": 128,
    "num_experts_per_tok": 8,
}
DEEPSEEK_V32 = {
    "architectures": ["DeepseekV32ForCausalLM"],
    "num_hidden_layers": 61,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "index_topk": 2048,
}


@pytest.mark.parametrize(
    ("config", "routing", "indexer"),
    [
        (QWEN3_MOE, RoutingShape(48, 8, 128), None),
        (DEEPSEEK_V32, RoutingShape(61, 8, 256), IndexerShape(61, 2048)),
        ({"text_config": QWEN3_MOE, "vision_config": {}}, RoutingShape(48, 8, 128), None),
        ({"num_hidden_layers": 36, "hidden_size": 4096}, None, None),
        ({**DEEPSEEK_V32, "compress_ratios": [0, 4, 4, 128]}, RoutingShape(61, 8, 256),
         IndexerShape(2, 2048)),
    ],
    ids=["qwen3-moe", "deepseek-v3.2", "vl-text-config", "dense", "v4-compress"],
)  # fmt: skip
def test_shapes_come_from_the_model_config(config, routing, indexer, tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_shapes(read_model_config(tmp_path)) == (routing, indexer)


def test_a_routing_shape_sizes_the_store() -> None:
    assert RoutingShape(48, 8, 128).dtype == np.uint8
    assert RoutingShape(48, 8, 128).row_bytes == 384
    assert RoutingShape(61, 8, 257).dtype == np.uint16
    assert RoutingShape.parse("48,8,128") == RoutingShape(48, 8, 128)
    assert str(IndexerShape.parse("61,2048")) == "61,2048"
    with pytest.raises(ReplayError, match="is not LAYERS,TOP_K,NUM_EXPERTS"):
        RoutingShape.parse("48,8")
    with pytest.raises(ReplayError, match="must lie in"):
        RoutingShape(48, 0, 128)
    with pytest.raises(ReplayError, match="cannot read the model config"):
        read_model_config("/nonexistent/model")


def test_vllm_tokens_sends_text_turns_to_the_tokens_route_for_their_versions(tokenizer) -> None:
    """`vllm-tokens://`: a text prompt goes to `/inference/v1/generate` as its ids (no
    `features`), never to `/v1/completions`, and the answer's spans are the turn's versions."""
    fake = FakeVLLM(reply, weight_version="w5", dev_mode=True)
    tokens = functools.partial(VLLMEngine, tokens_route=True)
    gen, srv = served(fake, tokens, request(None))
    assert not srv.bodies("/v1/completions")
    (body,) = srv.bodies("/inference/v1/generate")
    assert body["token_ids"] == PROMPT and "features" not in body
    assert gen.output_ids == SAMPLED
    assert gen.weight_versions == (WeightSpan("w5", 0, len(SAMPLED)),)
    assert isinstance(create_engine("vllm-tokens://127.0.0.1:8000", tokenizer), VLLMEngine)
