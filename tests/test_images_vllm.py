"""Images over vLLM, through the real adapter and the official Anthropic SDK, to a stand-in
that speaks vLLM's render and tokens-in/tokens-out routes: each image rendered by the server's
processor (`/v1/chat/completions/render`), the turn sampled from tokentrail's own ids with the
rendered features placed at its image tokens (`/inference/v1/generate`), whole or streamed;
the sample's tokens are the ones vLLM ran and sampled, and a server that sizes an image
differently is refused before it samples."""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass
from typing import Any

import anthropic
import pytest
from aiohttp import web

from support.fake_engines import IMAGE_PAD, VISION_END, VISION_START, FakeVLLM
from support.images import image_block, png
from tokentrail.adapter import Adapter, start_server
from tokentrail.engines.base import GenerateRequest, SamplingParams
from tokentrail.engines.vllm import VLLMEngine
from tokentrail.messages import ImageInput
from tokentrail.text.constraints import OutputConstraint
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.text.vision import vision_spec

SID = {"X-Session-Id": "s"}
RENDER, GENERATE = "/v1/chat/completions/render", "/inference/v1/generate"


@pytest.fixture(scope="module")
def qwen3_vl():
    return load_tokenizer("builtin:qwen3-vl")


def session(qwen3_vl, fake: FakeVLLM, turns: list[list[dict[str, Any]]], stream: bool = False):
    """`turns` (each a user message's blocks) as one Anthropic conversation through the adapter
    to `fake`: the replies (or the SDK's error), the finished trajectory, and the engine."""

    async def go() -> Any:
        async with fake as srv:
            engine = VLLMEngine(srv.url, qwen3_vl, model="m", stream=stream)
            adapter = Adapter(engine=engine, tokenizer=qwen3_vl)
            runner, url = await start_server(adapter)
            client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
            convo: list[dict[str, Any]] = []
            replies: list[Any] = []
            try:
                for blocks in turns:
                    convo.append({"role": "user", "content": blocks})
                    try:
                        reply = await client.messages.create(
                            model="m", max_tokens=16, messages=convo, extra_headers=SID
                        )
                    except anthropic.APIStatusError as exc:
                        replies.append(exc)
                        break
                    replies.append(reply)
                    content = [b.model_dump() for b in reply.content]
                    convo.append({"role": "assistant", "content": content})
                has = adapter.manager.has_session("s")
                return replies, (await adapter.finish_trajectory("s") if has else None)
            finally:
                await runner.cleanup()
                await engine.close()

    replies, trajectory = asyncio.run(go())
    return replies, trajectory


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_session_with_images_over_vllm_trains_on_what_vllm_ran(qwen3_vl, stream) -> None:
    a, b = png(40, 30, seed=3), png(30, 300, seed=4, fmt="JPEG")
    fake = FakeVLLM()
    turns = [
        [{"type": "text", "text": "hello"}],
        [{"type": "text", "text": "compare"}, image_block(a), image_block(b, "image/jpeg")],
        [{"type": "text", "text": "and this one again"}, image_block(a)],
    ]
    replies, trajectory = session(qwen3_vl, fake, turns, stream)
    assert all(isinstance(r, anthropic.types.Message) for r in replies), replies
    # The turn without images goes to /v1/completions; each with images is rendered, then
    # sampled on the tokens route (never /v1/completions, which would drop the images).
    assert len(fake.bodies("/v1/completions")) == 1
    renders, generates = fake.bodies(RENDER), fake.bodies(GENERATE)
    assert len(renders) == len(generates) == 2
    sent = [[p["image_url"]["url"] for p in r["messages"][0]["content"]] for r in renders]
    # Every image of the prompt, the earlier turn's too, in order.
    assert sent == [
        [data_url(a), data_url(b, "jpeg")],
        [data_url(a), data_url(b, "jpeg"), data_url(a)],
    ]
    assert all(g["stream"] is stream for g in generates)
    spec = vision_spec("qwen3-vl")
    assert spec is not None
    sizes = [spec.tokens(spec.grid(30, 40)), spec.tokens(spec.grid(300, 30))]
    last = generates[-1]
    ids = last["token_ids"]
    # The prompt holds the expanded runs (vLLM expands nothing on this route) and each
    # placeholder is one run: where tokentrail put the image, as long as vLLM sized it.
    runs = [p for p in last["features"]["mm_placeholders"]["image"]]
    assert [p["length"] for p in runs] == [sizes[0], sizes[1], sizes[0]]
    for p in runs:
        assert ids[p["offset"] - 1] == VISION_START
        assert ids[p["offset"] : p["offset"] + p["length"]] == [IMAGE_PAD] * p["length"]
    assert ids.count(IMAGE_PAD) == 2 * sizes[0] + sizes[1]
    # vLLM's processor cache held all three images' tensors by the last render: each comes
    # back as None, and the engine takes it from its own cache by hash.
    assert last["features"]["kwargs_data"] == {"image": [None, None, None]}
    assert all(item is not None for item in generates[0]["features"]["kwargs_data"]["image"])
    assert last["features"]["mm_hashes"]["image"][0] == last["features"]["mm_hashes"]["image"][2]
    assert last["sampling_params"]["logprobs"] == 0

    (sample,) = trajectory.samples
    tokens = sample.tokens.tolist()
    # The sample is the prompt vLLM ran, then what it sampled, token for token.
    assert tokens[: len(ids)] == ids
    answered = fake.answered[-1]["choices"][0]
    assert tokens[len(ids) :] == answered["token_ids"]
    trained = sample.rollout_log_probs[sample.loss_mask.astype(bool)]
    sampled = [c["logprob"] for c in answered["logprobs"]["content"]]
    assert trained[-len(sampled) :].tolist() == pytest.approx(sampled)
    ledger = trajectory.ledger
    assert ledger.trained_tokens == ledger.generated_tokens > 0
    assert [i["offset"] for i in sample.metadata["images"]] == [p["offset"] for p in runs]
    assert sample.multimodal_inputs()["images"] == [a, b, a]


def test_a_server_that_sizes_an_image_otherwise_is_refused_before_sampling(qwen3_vl) -> None:
    # A server launched with a smaller `max_pixels` (--mm-processor-kwargs) than the family's.
    fake = FakeVLLM(max_pixels=256 * 256)
    big = png(600, 400, seed=5)
    replies, _ = session(qwen3_vl, fake, [[{"type": "text", "text": "see"}, image_block(big)]])
    (error,) = replies
    assert isinstance(error, anthropic.APIStatusError) and error.status_code == 502
    assert "vllm sizes image 0 (600x400)" in error.body["error"]["message"]
    assert "--mm-processor-kwargs" in error.body["error"]["message"]
    assert fake.bodies(RENDER) and not fake.bodies(GENERATE)


def test_without_the_processor_cache_every_render_carries_the_tensors(qwen3_vl) -> None:
    # `--mm-processor-cache-gb 0`: render is idempotent, every item comes with its tensors.
    fake = FakeVLLM(processor_cache=False)
    shot = png(50, 40, seed=6)
    turns = [[image_block(shot)], [{"type": "text", "text": "again"}]]
    replies, trajectory = session(qwen3_vl, fake, turns)
    assert all(isinstance(r, anthropic.types.Message) for r in replies)
    items = [g["features"]["kwargs_data"]["image"] for g in fake.bodies(GENERATE)]
    assert len(items) == 2 and all(len(i) == 1 and i[0] is not None for i in items)
    assert trajectory.ledger.trained_tokens == trajectory.ledger.generated_tokens


def test_the_stand_in_refuses_features_vllm_would_refuse_or_misplace() -> None:
    fake = FakeVLLM()
    item = base64.b64encode(json.dumps({"image_grid_thw": [1, 2, 4], "mm_hash": "h"}).encode())
    encoded = item.decode()
    ids = [1, VISION_START, IMAGE_PAD, IMAGE_PAD, 151653, 2]

    def features(offset: int = 2, length: int = 2, data: Any = encoded) -> Any:
        return {
            "mm_hashes": {"image": ["h"]},
            "mm_placeholders": {"image": [{"offset": offset, "length": length}]},
            "kwargs_data": {"image": [data]},
        }

    assert fake._features_refusal(features(), ids) is None
    assert "not over the prompt's image tokens" in (
        fake._features_refusal(features(offset=1), ids) or ""
    )
    assert "outside" in (fake._features_refusal(features(offset=5), ids) or "")
    assert "Attempted to assign 2 multimodal tokens to 1" in (
        fake._features_refusal(features(length=1), ids) or ""
    )
    short = {**features(), "kwargs_data": {"image": []}}
    assert "differ in length" in (fake._features_refusal(short, ids) or "")
    # A None item is taken from the engine's cache: held after the first, unknown otherwise.
    assert fake._features_refusal(features(data=None), ids) is None
    fresh = FakeVLLM()
    assert "Expected a cached item" in (fresh._features_refusal(features(data=None), ids) or "")


@dataclass
class VLLMBeforeRender(FakeVLLM):
    """A vLLM from before the render route (0.10 to 0.19): `/v1/completions` only."""

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/completions", self._completions),
            web.get("/v1/models", self._models),
        ]


def test_a_vllm_without_the_render_route_says_what_to_use(qwen3_vl) -> None:
    fake = VLLMBeforeRender()
    replies, _ = session(qwen3_vl, fake, [[image_block(png(20, 20))]])
    (error,) = replies
    assert isinstance(error, anthropic.APIStatusError) and error.status_code == 502
    message = error.body["error"]["message"]
    assert f"serves no {RENDER} (a vLLM before 0.20)" in message and "sglang://" in message
    # Nothing went to /v1/completions, which would have run the image tokens without images.
    assert not fake.bodies("/v1/completions")


def test_a_render_without_features_is_an_engine_error(qwen3_vl) -> None:
    # A server whose model takes no images renders the chat with no features.
    fake = FakeVLLM()

    async def no_features(request: web.Request) -> web.Response:
        await fake._record(request)
        return web.json_response({"token_ids": [1, 2, 3], "features": None})

    fake.routes = lambda: [  # type: ignore[method-assign]
        web.post("/v1/chat/completions/render", no_features),
        web.post("/inference/v1/generate", fake._generate_tokens),
        web.get("/v1/models", fake._models),
    ]
    replies, _ = session(qwen3_vl, fake, [[image_block(png(20, 20))]])
    (error,) = replies
    assert isinstance(error, anthropic.APIStatusError) and error.status_code == 502
    assert "answered without features" in error.body["error"]["message"]
    assert not fake.bodies(GENERATE)


def image_request(rid: str, **sampling: Any) -> GenerateRequest:
    """A prompt of one 64x48 PNG's run between two text tokens, as the pipeline builds it."""
    spec = vision_spec("qwen3-vl")
    assert spec is not None
    data = png(64, 48, seed=9)
    grid = spec.grid(48, 64)
    image = ImageInput("d" * 64, "image/png", data, 64, 48, grid, spec.tokens(grid))
    ids = [7, VISION_START, *[IMAGE_PAD] * image.tokens, VISION_END, 8]
    return GenerateRequest(
        ids,
        SamplingParams(max_new_tokens=16, **sampling),
        "s",
        rid,
        images=[image],
        image_pad_id=IMAGE_PAD,
    )


def test_the_tokens_request_carries_the_turns_sampling_as_vllms_sampling_params() -> None:
    async def go() -> Any:
        async with FakeVLLM() as srv:
            engine = VLLMEngine(srv.url, model="m")
            req = image_request("v-img", temperature=0.5, top_p=0.9, top_k=20, stop=["</x>"])
            req.sampling.seed = 3
            req.constraint = OutputConstraint(regex="a+", wants="a tool call")
            gen = await engine.generate(req)
            await engine.close()
            return gen, srv

    gen, srv = asyncio.run(go())
    (body,) = srv.bodies(GENERATE)
    assert body["request_id"] == "v-img" and body["model"] == "m"
    assert body["sampling_params"] == {
        "max_tokens": 16,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "stop": ["</x>"],
        "logprobs": 0,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "seed": 3,
        "structured_outputs": {"regex": "a+"},
    }
    # 64x48 is scaled up to the processor's 65536-pixel minimum: 70 tokens, after two ids.
    assert body["features"]["mm_placeholders"] == {"image": [{"offset": 2, "length": 70}]}
    answered = srv.answered[0]["choices"][0]
    assert gen.output_ids == answered["token_ids"] and gen.finish_reason == "stop"
    assert gen.logprobs == [c["logprob"] for c in answered["logprobs"]["content"]]
    assert gen.prompt_tokens == len(body["token_ids"])


def test_an_aborted_image_turn_closes_the_tokens_call() -> None:
    async def go() -> Any:
        async with FakeVLLM(mode="hang") as srv:
            engine = VLLMEngine(srv.url, model="m")
            task = asyncio.create_task(engine.generate(image_request("v-abort")))
            for _ in range(500):
                if srv.bodies(GENERATE):
                    break
                await asyncio.sleep(0.01)
            await engine.abort("v-abort")
            gen = await asyncio.wait_for(task, 5)
            for _ in range(500):
                if srv.disconnected:
                    break
                await asyncio.sleep(0.01)
            await engine.close()
            return gen, srv

    gen, srv = asyncio.run(go())
    assert (gen.output_ids, gen.finish_reason) == ([], "abort")
    assert srv.disconnected == ["v-abort"]
