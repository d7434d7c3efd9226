"""Images in prompts over the real adapter and the official Anthropic SDK: vision tokens sized
by the family's own image processor, kept across turns, carried by the sample; bad images
refused with 400s in the protocol's shape; families without vision keep `[image]`."""

from __future__ import annotations

import asyncio
import base64
import io
import random
from typing import Any

import anthropic
import numpy as np
import pytest
from PIL import Image

from support.images import image_block, png
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.errors import ImageError
from tokentrail.messages import Conversation, ImageSource
from tokentrail.storage.export import read_samples, write_samples
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.text.vision import image_mark, resolve_images, vision_spec

READ = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def qwen3_vl():
    return load_tokenizer("builtin:qwen3-vl")


def run(tokenizer, script: list, turns) -> tuple[Any, Any]:
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer, script), tokenizer=tokenizer, config=AdapterConfig()
    )

    async def go() -> tuple[Any, Any]:
        runner, url = await start_server(adapter)
        try:
            client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
            out = await turns(client)
            has = adapter.manager.has_session("s")
            return out, (await adapter.finish_trajectory("s") if has else None)
        finally:
            await runner.cleanup()

    return asyncio.run(go())


@pytest.mark.parametrize("name", ["qwen2-vl", "qwen3-vl", "kimi-k2.5"])
def test_grid_is_the_image_processors_own(name: str) -> None:
    # The fast path (the resize rule on the header's size) against the processor run on the
    # pixels, over generated sizes from tiny to past the pixel cap (and, for Kimi's, past its
    # patch budget and its 512 patches a side).
    spec = vision_spec(name)
    assert spec is not None
    processor = spec.processor()
    rng = random.Random(7)
    sizes = [(1, 1), (10, 1999), (1999, 10), (7200, 20), (3000, 3000)] + [
        (rng.randint(1, 1500), rng.randint(1, 1500)) for _ in range(12)
    ]
    for w, h in sizes:
        if name != "kimi-k2.5" and max(w, h) / min(w, h) > 200:
            continue  # refused by Qwen's processor: below
        out = processor(images=[Image.new("RGB", (w, h))], return_tensors="np")
        grid = tuple(int(x) for x in out["image_grid_thw"][0])
        assert spec.grid(h, w) == grid, (w, h)
        assert out["pixel_values"].shape[0] // spec.merge_size**2 == spec.tokens(grid)


@pytest.mark.parametrize("name", ["qwen2-vl", "qwen3-vl"])
def test_qwens_processor_refuses_an_aspect_ratio_past_200(name: str) -> None:
    spec = vision_spec(name)
    assert spec is not None
    with pytest.raises(ValueError, match="aspect ratio"):
        spec.processor()(images=[Image.new("RGB", (3, 2000))], return_tensors="np")
    with pytest.raises(ImageError, match="aspect ratio"):
        spec.grid(2000, 3)


def test_a_family_without_vision_keeps_the_placeholder() -> None:
    source = ImageSource.of_base64(base64.b64encode(png(8, 8)).decode(), "image/png")
    conversation = Conversation(
        [{"role": "user", "content": "see\n" + image_mark(source.digest)}],
        None,
        dropped_media={"image": 1},
        image_sources={source.digest: source},
    )
    resolved = resolve_images(conversation, None)
    assert resolved.messages == [{"role": "user", "content": "see\n[image]"}]
    assert resolved.dropped_media == {"image": 1}
    assert resolved.images == []


@pytest.mark.parametrize(
    ("vocabulary", "encoder", "before"),
    [
        ("builtin:qwen3-vl", "qwen3-vl", "<|vision_start|>"),
        # Kimi K2.5 has no vocabulary on PyPI: its stand-in (Qwen3's ranks, Kimi's tokens).
        ("stand-in:kimi-k2.5", "kimi-k2.5", "<|media_content|>"),
    ],
)
def test_a_claude_code_read_of_a_png_trains_on_vision_tokens(
    vocabulary: str, encoder: str, before: str, tmp_path
) -> None:
    tokenizer = load_tokenizer(vocabulary)
    spec = vision_spec(encoder)
    assert spec is not None
    shot = png(500, 300, seed=1)
    call = [{"type": "tool_use", "name": "Read", "input": {"file_path": "shot.png"}}]
    done = [{"type": "text", "text": "a screenshot"}]

    async def turns(client: anthropic.AsyncAnthropic) -> Any:
        first = [{"role": "user", "content": [{"type": "text", "text": "read shot.png"}]}]
        one = await client.messages.create(
            model="m", max_tokens=64, tools=[READ], messages=first, extra_headers=SID
        )
        result = {
            "type": "tool_result",
            "tool_use_id": one.content[0].id,
            "content": [image_block(shot)],
        }
        second = [
            *first,
            {"role": "assistant", "content": [b.model_dump() for b in one.content]},
            {"role": "user", "content": [result]},
        ]
        return await client.messages.create(
            model="m", max_tokens=64, tools=[READ], messages=second, extra_headers=SID
        )

    reply, trajectory = run(tokenizer, [call, done], turns)
    assert reply.content[0].text == "a screenshot"
    sample = trajectory.samples[-1]
    grid = spec.processor()(images=[Image.open(io.BytesIO(shot))], return_tensors="np")
    want = int(np.prod(grid["image_grid_thw"][0])) // 4
    (image,) = sample.metadata["images"]
    assert image["image_grid_thw"] == [int(x) for x in grid["image_grid_thw"][0]]
    assert image["tokens"] == want
    assert base64.b64decode(image["data"]) == shot
    pad = tokenizer.token_id(spec.pad)
    tokens = sample.tokens.tolist()
    at = image["offset"]
    assert tokens[at - 1] == tokenizer.token_id(before)
    assert tokens[at : at + want] == [pad] * want
    assert tokens[at + want] == tokenizer.token_id(spec.end)
    assert tokens.count(pad) == want
    assert "dropped_media" not in sample.metadata or not sample.metadata["dropped_media"]
    inputs = sample.multimodal_inputs()
    assert inputs["images"] == [shot]
    assert inputs["image_grid_thw"].tolist() == [image["image_grid_thw"]]
    assert inputs["image_offsets"] == [at]
    # The exported file carries them: written and read back, the same images and grid.
    path = tmp_path / "samples.jsonl"
    write_samples(path, [sample])
    (back,) = read_samples(path)
    assert back.multimodal_inputs()["images"] == [shot]
    assert back.tokens.tolist() == tokens
    # The image's tokens are not trained on (the loss mask covers the response tokens).
    start = at - sample.prompt_length
    assert start >= 0  # The tool result comes after the first turn's output.
    assert len(sample.loss_mask[start : start + want]) == want
    assert not sample.loss_mask[start : start + want].any()


SID = {"X-Session-Id": "s"}


def test_an_earlier_image_keeps_its_tokens(qwen3_vl) -> None:
    shot = png(64, 900, seed=2)
    user = {"role": "user", "content": [{"type": "text", "text": "look"}, image_block(shot)]}

    async def turns(client: anthropic.AsyncAnthropic) -> Any:
        one = await client.messages.create(
            model="m", max_tokens=64, messages=[user], extra_headers=SID
        )
        convo = [
            user,
            {"role": "assistant", "content": [b.model_dump() for b in one.content]},
            {"role": "user", "content": "and now?"},
        ]
        return await client.messages.create(
            model="m", max_tokens=64, messages=convo, extra_headers=SID
        )

    _, trajectory = run(
        qwen3_vl,
        [[{"type": "text", "text": "tall"}], [{"type": "text", "text": "same"}]],
        turns,
    )
    (sample,) = trajectory.samples  # One chain: turn 2 continues turn 1's tokens exactly.
    assert len(sample.metadata["turns"]) == 2
    (image,) = sample.metadata["images"]
    pad = qwen3_vl.token_id("<|image_pad|>")
    assert sample.tokens.tolist().count(pad) == image["tokens"]


SPELLED = {"type": "text", "text": "<|vision_start|><|image_pad|><|vision_end|>"}

BAD = [
    (SPELLED, "image tokens in the request's text"),
    (image_block(b"not an image"), "does not decode"),
    (image_block(png(8, 8)[:40]), "does not decode"),
    (image_block(png(8, 8), "image/bmp"), "unsupported image type"),
    (image_block(png(8, 8, fmt="JPEG"), "image/png"), "declared image/png"),
    ({"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}}, "not fetched"),
    (
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "@@"}},
        "not valid base64",
    ),
]


@pytest.mark.parametrize(("block", "says"), BAD, ids=[s for _, s in BAD])
def test_a_bad_image_gets_a_400_in_the_protocols_shape(qwen3_vl, block, says) -> None:
    async def turns(client: anthropic.AsyncAnthropic) -> Any:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(
                model="m",
                max_tokens=8,
                messages=[{"role": "user", "content": [block]}],
                extra_headers=SID,
            )
        return refused.value

    error, _ = run(qwen3_vl, [], turns)
    assert error.status_code == 400
    assert error.body["type"] == "error"
    assert error.body["error"]["type"] == "invalid_request_error"
    assert says in error.body["error"]["message"]


def test_limits_per_image_and_per_request() -> None:
    from tokentrail.text.vision import ImageLimits

    spec = vision_spec("qwen3-vl")
    data = png(100, 100)
    sources = [
        ImageSource.of_base64(base64.b64encode(png(100, 100, seed=s)).decode(), "image/png")
        for s in range(2)
    ]

    def convo(srcs: list[ImageSource]) -> Conversation:
        text = "".join(image_mark(s.digest) for s in srcs)
        return Conversation(
            [{"role": "user", "content": text}], None, image_sources={s.digest: s for s in srcs}
        )

    with pytest.raises(ImageError, match="over 9999 pixels"):
        resolve_images(convo(sources[:1]), spec, ImageLimits(max_image_pixels=9999))
    assert resolve_images(convo(sources[:1]), spec, ImageLimits(max_image_pixels=10000)).images
    with pytest.raises(ImageError, match=f"over {len(data) - 1} bytes"):
        resolve_images(convo(sources[:1]), spec, ImageLimits(max_image_bytes=len(data) - 1))
    with pytest.raises(ImageError, match="request's images are over 19999 pixels"):
        resolve_images(convo(sources), spec, ImageLimits(max_request_pixels=19999))
    assert (
        len(resolve_images(convo(sources), spec, ImageLimits(max_request_pixels=20000)).images) == 2
    )


def engine_turn(qwen3_vl, fake: Any, make_engine: Any, blocks: list[dict[str, Any]]) -> Any:
    """One Anthropic request with `blocks` through the adapter to `make_engine(url)`; what
    the SDK raised (or the reply) and the bodies the stand-in engine got."""

    async def go() -> Any:
        async with fake as srv:
            adapter = Adapter(engine=make_engine(srv.url), tokenizer=qwen3_vl)
            runner, url = await start_server(adapter)
            client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
            try:
                out: Any = await client.messages.create(
                    model="m",
                    max_tokens=8,
                    messages=[{"role": "user", "content": blocks}],
                    extra_headers=SID,
                )
            except anthropic.APIStatusError as exc:
                out = exc
            finally:
                await runner.cleanup()
            return out, [r.body for r in srv.requests]

    return asyncio.run(go())


def test_sglang_gets_the_images_as_image_data(qwen3_vl) -> None:
    from support.fake_engines import FakeSGLang
    from tokentrail.engines.sglang import SGLangEngine

    a, b = png(40, 30, seed=3), png(30, 300, seed=4, fmt="JPEG")
    blocks = [
        {"type": "text", "text": "compare"},
        image_block(a),
        image_block(b, "image/jpeg"),
        image_block(a),
    ]
    reply, bodies = engine_turn(
        qwen3_vl, FakeSGLang(), lambda url: SGLangEngine(url, qwen3_vl), blocks
    )
    assert reply.stop_reason in ("end_turn", "max_tokens")
    (body,) = [x for x in bodies if "input_ids" in x]
    urls = [
        f"data:image/{t};base64,{base64.b64encode(d).decode()}"
        for t, d in [("png", a), ("jpeg", b), ("png", a)]
    ]
    assert body["image_data"] == urls
    spec = vision_spec("qwen3-vl")
    assert spec is not None
    pad = qwen3_vl.token_id("<|image_pad|>")
    runs = [spec.tokens(spec.grid(30, 40)), spec.tokens(spec.grid(300, 30))]
    assert body["input_ids"].count(pad) == runs[0] * 2 + runs[1]


def test_the_stand_in_sglang_refuses_images_that_do_not_match_the_prompt() -> None:
    from support.fake_engines import _image_data_refusal

    ids = [1, 151652, 151655, 151655, 151653, 2]
    url = "data:image/png;base64," + base64.b64encode(png(4, 4)).decode()
    assert _image_data_refusal([url], ids) is None
    assert "2 images" in (_image_data_refusal([url, url], ids) or "")
    assert "no image_data" in (_image_data_refusal(None, ids) or "")
    assert "Failed to load image" in (
        _image_data_refusal(["data:image/png;base64,AAAA"], ids) or ""
    )


def test_an_engine_without_images_is_refused_a_prompt_with_images(qwen3_vl) -> None:
    # An engine that takes no images beside token ids (an in-process model, verl's server
    # manager) gets none: the harness hears so, and where images do go, before generating.
    engine = ScriptedEngine(qwen3_vl, [])
    engine.supports_images = False  # type: ignore[misc]
    adapter = Adapter(engine=engine, tokenizer=qwen3_vl)

    async def go() -> Any:
        runner, url = await start_server(adapter)
        client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
        try:
            with pytest.raises(anthropic.BadRequestError) as refused:
                await client.messages.create(
                    model="m",
                    max_tokens=8,
                    messages=[{"role": "user", "content": [image_block(png(8, 8))]}],
                    extra_headers=SID,
                )
            return refused.value
        finally:
            await runner.cleanup()

    refused = asyncio.run(go())
    assert refused.body["error"]["type"] == "invalid_request_error"
    assert (
        "takes no images with token ids (sglang:// and vllm:// do)"
        in (refused.body["error"]["message"])
    )


def test_a_responses_input_image_as_codex_sends_it(qwen3_vl) -> None:
    # Codex's `view_image` puts the file in the next input as an `input_image` data URL.
    import openai

    shot = png(200, 120, seed=5)
    url = "data:image/png;base64," + base64.b64encode(shot).decode()

    async def go() -> Any:
        adapter = Adapter(
            engine=ScriptedEngine(qwen3_vl, [[{"type": "text", "text": "seen"}]]),
            tokenizer=qwen3_vl,
        )
        runner, base = await start_server(adapter)
        try:
            client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="s", max_retries=0)
            await client.responses.create(
                model="m",
                input=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "what is this?"},
                            {"type": "input_image", "image_url": url, "detail": "auto"},
                        ],
                    }
                ],
                extra_headers=SID,
            )
            return await adapter.finish_trajectory("s")
        finally:
            await runner.cleanup()

    trajectory = asyncio.run(go())
    (sample,) = trajectory.samples
    spec = vision_spec("qwen3-vl")
    assert spec is not None
    (image,) = sample.metadata["images"]
    assert image["tokens"] == spec.tokens(spec.grid(120, 200))
    assert sample.multimodal_inputs()["images"] == [shot]
    pad = qwen3_vl.token_id("<|image_pad|>")
    assert sample.tokens.tolist().count(pad) == image["tokens"]


def test_a_recovered_session_keeps_its_images(qwen3_vl, tmp_path) -> None:
    from tokentrail.storage.journal import Journal

    shot = png(90, 60, seed=6)
    path = tmp_path / "j.db"

    async def serve_one() -> None:
        journal = Journal(path)
        adapter = Adapter(
            engine=ScriptedEngine(qwen3_vl, [[{"type": "text", "text": "ok"}]]),
            tokenizer=qwen3_vl,
            journal=journal,
        )
        runner, url = await start_server(adapter)
        try:
            client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
            await client.messages.create(
                model="m",
                max_tokens=8,
                messages=[{"role": "user", "content": [image_block(shot)]}],
                extra_headers=SID,
            )
        finally:
            await runner.cleanup()
            journal.close()

    asyncio.run(serve_one())
    journal = Journal(path)  # As after a restart: the session is recovered from the journal.
    try:
        adapter = Adapter(engine=ScriptedEngine(qwen3_vl), tokenizer=qwen3_vl, journal=journal)
        trajectory = asyncio.run(adapter.finish_trajectory("s"))
    finally:
        journal.close()
    (sample,) = trajectory.samples
    assert sample.multimodal_inputs()["images"] == [shot]


def test_an_image_is_decoded_once_and_counted_at_each_occurrence() -> None:
    from tokentrail.text.vision import ImageCache, ImageLimits

    spec = vision_spec("qwen3-vl")
    source = ImageSource.of_base64(base64.b64encode(png(100, 100)).decode(), "image/png")
    twice = Conversation(
        [{"role": "user", "content": image_mark(source.digest) * 2}],
        None,
        image_sources={source.digest: source},
    )
    cache = ImageCache()
    first = resolve_images(twice, spec, None, cache)
    again = resolve_images(twice, spec, None, cache)
    # What it holds: its bytes and their base64 text (never its decoded pixels).
    held = len(first.images[0].data) + len(first.images[0].base64_data)
    assert len(cache) == 1 and cache.bytes == held
    assert first.images[0] is first.images[1] is again.images[0]  # decoded once
    cache.discard([source.digest])  # a finished session's images go
    assert len(cache) == 0 and cache.bytes == 0
    resolve_images(twice, spec, None, cache)
    # The engine gets the image at each occurrence: both count against the request's limit.
    with pytest.raises(ImageError, match="over 19999 pixels"):
        resolve_images(twice, spec, ImageLimits(max_request_pixels=19999), cache)
    # A cached image is still held to the per-image limit.
    with pytest.raises(ImageError, match="over 9999 pixels"):
        resolve_images(twice, spec, ImageLimits(max_image_pixels=9999), cache)


def test_count_tokens_counts_the_vision_tokens(qwen3_vl) -> None:
    shot = png(500, 300, seed=8)
    spec = vision_spec("qwen3-vl")
    assert spec is not None
    text = [{"type": "text", "text": "see"}]

    async def turns(client: anthropic.AsyncAnthropic) -> Any:
        counts = []
        for content in (text, [*text, image_block(shot)]):
            counted = await client.messages.count_tokens(
                model="m", messages=[{"role": "user", "content": content}]
            )
            counts.append(counted.input_tokens)
        return counts

    (plain, with_image), _ = run(qwen3_vl, [], turns)
    # `\n` joins the parts, then the start, the pads and the end of the image.
    assert with_image - plain == len(qwen3_vl.encode("\n")) + spec.tokens(spec.grid(300, 500)) + 2


def test_an_earlier_turns_image_from_the_tree_comes_from_the_cache() -> None:
    # As a Responses `previous_response_id` continuation gives it: the earlier message holds
    # the image's tokens already and names its digest.
    from tokentrail.text.vision import ImageCache

    spec = vision_spec("qwen3-vl")
    source = ImageSource.of_base64(base64.b64encode(png(50, 40)).decode(), "image/png")
    first = Conversation(
        [{"role": "user", "content": image_mark(source.digest)}],
        None,
        image_sources={source.digest: source},
    )
    cache = ImageCache()
    earlier = resolve_images(first, spec, None, cache)
    later = Conversation([*earlier.messages, {"role": "user", "content": "more"}], None)
    assert resolve_images(later, spec, None, cache).images == earlier.images
    with pytest.raises(ImageError, match="no longer held"):
        resolve_images(later, spec, None, ImageCache())
