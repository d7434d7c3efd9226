"""A real vision-language model in the loop: a tiny Qwen2.5-VL and a tiny Qwen3-VL (seeded
random weights, the real Qwen vocabulary, two-block vision towers over their families' patches)
answer sessions with images, over the real adapter with the official Anthropic SDK and under the
real Claude Code CLI, and the recompute audit, feeding each sample's tokens and images to the
model, holds every trained logprob to one uncached forward pass; the same sample with an image
swapped for another of the same size (the same tokens) fails it.

torch runs on one thread here (the CI machine has two cores).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import numpy as np
import pytest

from support.claude_code import CLAUDE_CODE_VERSION, install_claude_code, run_claude
from support.images import image_block, png
from support.serve import serving
from support.threads import one_torch_thread
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.cli import main as cli_main
from tokentrail.engines import create_engine
from tokentrail.engines.base import GenerateRequest, SamplingParams
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.engines.transformers_lm import TransformersEngine
from tokentrail.errors import ModelError
from tokentrail.messages import ImageInput
from tokentrail.model.audit import DEFAULT_TOLERANCE, recompute_samples
from tokentrail.model.forward import CausalLM
from tokentrail.model.tiny import tiny_model
from tokentrail.storage.export import write_samples
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.sample import Sample

READ = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
}


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


MODELS = {
    "qwen2.5-vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3-vl": "Qwen3VLForConditionalGeneration",
}


@pytest.fixture(scope="module", params=list(MODELS))
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def path(name: str) -> Path:
    return tiny_model(name)


@pytest.fixture(scope="module")
def lm(path: Path) -> CausalLM:
    return CausalLM(path)


def image_input(lm: CausalLM, data: bytes, width: int, height: int) -> ImageInput:
    assert lm.vision is not None
    grid = lm.vision.spec.grid(height, width)
    return ImageInput("", "image/png", data, width, height, grid, lm.vision.spec.tokens(grid))


def with_images(lm: CausalLM, rng: np.random.Generator, images: list[ImageInput]) -> list[int]:
    """Random text ids with each image's placeholder run between them."""
    assert lm.vision is not None
    start, end = 151652, 151653  # <|vision_start|>, <|vision_end|>
    ids = rng.integers(0, 150000, 20).tolist()
    for image in images:
        ids += [start, *[lm.vision.pad_id] * image.tokens, end]
        ids += rng.integers(0, 150000, 25).tolist()
    return ids


# --- the model and its forward pass ----------------------------------------------------------


def test_the_tiny_vl_model_is_its_architecture_with_the_adapters_image_sizes(
    name: str, path: Path, lm
) -> None:
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == [MODELS[name]]
    assert type(lm.model).__name__ == MODELS[name]
    tokenizer = load_tokenizer(str(path))
    # Its template is Qwen3's, its config names the vision family: prompts get image tokens.
    assert tokenizer.family == name
    assert config["image_token_id"] == tokenizer.token_id("<|image_pad|>")
    family_vision = {"qwen2.5-vl": "qwen2-vl", "qwen3-vl": "qwen3-vl"}[name]
    assert lm.vision is not None and lm.vision.spec.name == family_vision
    vision = config["vision_config"]
    spec = lm.vision.spec
    assert (vision["patch_size"], vision["spatial_merge_size"], vision["temporal_patch_size"]) == (
        spec.patch_size,
        spec.merge_size,
        spec.temporal_patch_size,
    )
    # The tower's output has one row per image token the adapter counted.
    image = image_input(lm, png(112, 84, 1), 112, 84)
    pixels, grid = lm.vision.pixels(image)
    features = lm.model.model.get_image_features(pixels, grid, return_dict=True).pooler_output[0]
    assert features.shape == (image.tokens, config["text_config"]["hidden_size"])


def test_a_forward_with_images_is_the_models_own_and_caching_changes_nothing(lm) -> None:
    """One pass equals transformers' own forward (pixel values, `image_grid_thw`, its M-RoPE
    positions from `get_rope_index`, Qwen3-VL's deepstack features); a KV-cached forward in
    pieces, cut inside an image's run too, equals the one pass."""
    import torch

    assert lm.vision is not None
    images = [
        image_input(lm, png(112, 84, 1), 112, 84),
        image_input(lm, png(56, 70, 2), 56, 70),
    ]
    ids = with_images(lm, np.random.default_rng(0), images)
    hidden, _ = lm.forward(ids, images=images)
    reference = lm.logprobs(hidden[:-1], ids[1:])
    pixels, grids = zip(*(lm.vision.pixels(i) for i in images), strict=True)
    tensor = torch.tensor([ids])
    with torch.inference_mode():
        own = lm.model.model(
            input_ids=tensor,
            pixel_values=torch.cat(pixels),
            image_grid_thw=torch.cat(grids),
            mm_token_type_ids=(tensor == lm.vision.pad_id).int(),
        )
    assert np.abs(lm.logprobs(own.last_hidden_state[0, :-1], ids[1:]) - reference).max() < 1e-5
    first, n = 20 + 1, len(ids)  # the first image's run starts at `first`
    assert n > 80
    for cuts in ([10, 40, 60], [first, first + 5, n - 3], [first + 3, 70, n - 1]):
        cache, parts, start = lm.new_cache(), [], 0
        for cut in [*cuts, len(ids)]:
            h, _ = lm.forward(ids[start:cut], cache, images=images, context=ids[:start])
            parts.append(h)
            start = cut
        again = lm.logprobs(torch.cat(parts)[:-1], ids[1:])
        assert np.abs(again - reference).max() < 1e-5, cuts
    # The pixels feed the logits: another image of the same size moves them.
    swapped = [image_input(lm, png(112, 84, 9), 112, 84), images[1]]
    hidden, _ = lm.forward(ids, images=swapped)
    assert np.abs(lm.logprobs(hidden[:-1], ids[1:]) - reference).max() > 100 * DEFAULT_TOLERANCE
    # Image runs that are not the images are refused by name.
    with pytest.raises(ModelError, match="2 image runs .* for 1 images"):
        lm.forward(ids, images=images[:1])
    with pytest.raises(ModelError, match="image 0: its run holds"):
        lm.forward(ids, images=images[::-1])


def test_a_cached_prefix_is_not_reused_past_an_image_that_changed(path: Path, lm) -> None:
    """Two prompts with the same tokens and another image of the same size: the second turn
    computes again from that image's run, and its logprobs are those of its own image."""
    tokenizer = load_tokenizer(str(path))
    engine = TransformersEngine(path, tokenizer, inner=ScriptedEngine(tokenizer, [[]] * 4))
    first = [image_input(lm, png(112, 84, 1), 112, 84)]
    other = [image_input(lm, png(112, 84, 5), 112, 84)]
    prompt = with_images(lm, np.random.default_rng(3), first)

    def turn(images: list[ImageInput]) -> tuple[list[float], int]:
        before = engine.computed_positions
        req = GenerateRequest(prompt, SamplingParams(16), session_id="s", images=images)
        return asyncio.run(engine.generate(req)).logprobs, engine.computed_positions - before

    one, computed = turn(first)
    fed = len(prompt) + len(one) - 1  # the prompt and the reply but its last token
    assert computed == fed
    again, computed = turn(first)
    assert again == pytest.approx(one, abs=1e-5)
    assert computed == len(one)  # the prompt is cached: its last token and the reply
    swapped, computed = turn(other)
    assert computed == fed - 21  # from the image's run (position 21) on
    assert np.abs(np.asarray(swapped) - np.asarray(one)).max() > 100 * DEFAULT_TOLERANCE
    # The first image's line is kept beside the new one.
    back, computed = turn(first)
    assert back == pytest.approx(one, abs=1e-5) and computed == len(one)


def test_sampling_with_images_reports_the_models_logprobs(path: Path, lm) -> None:
    """The engine samples (no teacher forcing) over a prompt with an image, token by token on
    its cache; the one-pass audit over prompt, output and image agrees."""
    tokenizer = load_tokenizer(str(path))
    engine = TransformersEngine(path, tokenizer)
    images = [image_input(lm, png(112, 84, 4), 112, 84)]
    prompt = with_images(lm, np.random.default_rng(6), images)
    params = SamplingParams(max_new_tokens=12, temperature=0.8, seed=2)
    gen = asyncio.run(engine.generate(GenerateRequest(prompt, params, "s", images=images)))
    assert len(gen.output_ids) > 1
    offset = prompt.index(lm.vision.pad_id) if lm.vision is not None else -1
    image = {
        "data": base64.b64encode(images[0].data).decode(),
        "image_grid_thw": list(images[0].grid_thw),
        "offset": offset,
    }
    sample = Sample(
        tokens=np.asarray(prompt + gen.output_ids, dtype=np.uint32),
        loss_mask=np.ones(len(gen.output_ids), dtype=np.uint8),
        rollout_log_probs=np.asarray(gen.logprobs, dtype=np.float32),
        response_length=len(gen.output_ids),
        metadata={"images": [image]},
    )
    report = recompute_samples(lm, [sample], temperature=0.8)
    assert report.max_error <= DEFAULT_TOLERANCE and report.ok, report.table()


# --- a session over the adapter --------------------------------------------------------------


def session_script() -> list[list[dict[str, Any]]]:
    return [
        [{"type": "text", "text": "A screenshot of a terminal. Let me read calc.py."},
         {"type": "tool_use", "name": "Read", "input": {"file_path": "calc.py"}}],
        [{"type": "tool_use", "name": "Read", "input": {"file_path": "plot.png"}}],
        [{"type": "text", "text": "calc.py sums; plot.png is a bar chart."}],
    ]  # fmt: skip


def run_session(engine: Any, tokenizer: Any, shot: bytes, plot: bytes) -> Any:
    """Three turns of the Anthropic SDK against the adapter on a real socket: an image in the
    first user message, a text tool result, an image tool result; then the session's finish."""
    adapter = Adapter(engine=engine, tokenizer=tokenizer, config=AdapterConfig())

    async def go() -> Any:
        runner, url = await start_server(adapter)
        try:
            client = anthropic.AsyncAnthropic(base_url=url, api_key="vl", max_retries=0)
            messages: list[dict[str, Any]] = [
                {
                    "role": "user",
                    "content": [image_block(shot), {"type": "text", "text": "What is this?"}],
                }
            ]
            results = [
                [{"type": "text", "text": "def add(a, b):\n    return a + b\n"}],
                [image_block(plot)],
            ]
            for result in [*results, None]:
                reply = await client.messages.create(
                    model="m", max_tokens=64, tools=[READ], messages=messages
                )
                if result is None:
                    assert reply.stop_reason == "end_turn"
                    break
                assert reply.stop_reason == "tool_use"
                call = next(b for b in reply.content if b.type == "tool_use")
                messages += [
                    {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": call.id, "content": result}
                        ],
                    },
                ]
            return await adapter.finish_trajectory("vl", reward=1.0)
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_a_session_with_images_on_a_real_vl_model_passes_the_audit(
    name: str, path: Path, lm, tmp_path: Path
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(session_script()))
    tokenizer = load_tokenizer(str(path))
    engine = create_engine(f"transformers:tiny:{name}+scripted:{script}", tokenizer)
    assert isinstance(engine, TransformersEngine) and engine.supports_images
    shot, plot = png(224, 140, 11), png(84, 112, 12)
    trajectory = run_session(engine, tokenizer, shot, plot)
    ledger = trajectory.ledger
    assert len(ledger.turns) == 3
    assert ledger.trained_tokens == ledger.generated_tokens > 0
    # Later turns reuse the cache over the images before them.
    assert engine.cached_positions > 0
    (sample,) = trajectory.samples
    inputs = sample.multimodal_inputs()
    assert inputs is not None and inputs["images"] == [shot, plot]
    report = recompute_samples(lm, [sample])
    print(f"\ntiny {name}, 3 turns, 2 images\n{report.table()}")
    assert report.trained == ledger.trained_tokens
    assert report.within_tolerance == report.trained
    assert report.max_error <= DEFAULT_TOLERANCE and report.ok

    # The first image swapped for another of its size: the same tokens, other pixels.
    swapped = swap_image(sample, 0, png(224, 140, 99))
    assert swapped.tokens.tolist() == sample.tokens.tolist()
    report = recompute_samples(lm, [swapped])
    print(f"tiny {name}, first image swapped\n{report.table()}")
    assert not report.ok
    assert report.max_error > 100 * DEFAULT_TOLERANCE
    assert report.within_tolerance < report.trained

    # The second image (a tool result) swapped: only the tokens after it move.
    after = sample.multimodal_inputs()["image_offsets"][1]
    trained = sample.prompt_length + np.flatnonzero(sample.loss_mask)
    report = recompute_samples(lm, [swap_image(sample, 1, png(84, 112, 98))])
    assert not report.ok and report.max_error > 100 * DEFAULT_TOLERANCE
    assert 0 < int((trained < after).sum()) <= report.within_tolerance < report.trained

    # `tokentrail audit --recompute` over the exported file: the images travel with it.
    good, bad = tmp_path / "samples.jsonl", tmp_path / "swapped.jsonl"
    write_samples(good, [sample])
    write_samples(bad, [swapped])
    assert cli_main(["audit", "--recompute", str(path), str(good)]) == 0
    assert cli_main(["audit", "--recompute", str(path), str(bad)]) == 1

    # A sample whose images do not fit its tokens is refused by name, not audited wrong.
    dropped = copy.deepcopy(sample)
    dropped.metadata["images"] = dropped.metadata["images"][:1]
    with pytest.raises(ModelError, match="2 image runs .* for 1 images"):
        recompute_samples(lm, [dropped])
    moved = copy.deepcopy(sample)
    moved.metadata["images"][1]["offset"] += 1
    with pytest.raises(ModelError, match="offsets"):
        recompute_samples(lm, [moved])
    text_lm = CausalLM(tiny_model("qwen3"))
    with pytest.raises(ModelError, match="is a text model"):
        recompute_samples(text_lm, [sample])


def swap_image(sample: Sample, k: int, data: bytes) -> Sample:
    metadata = copy.deepcopy(sample.metadata)
    metadata["images"][k]["data"] = base64.b64encode(data).decode()
    return dataclasses.replace(sample, metadata=metadata)


# --- a real harness --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def claude_exe() -> Path:
    if shutil.which("npm") is None:
        reason = f"npm is missing: cannot install @anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    exe = install_claude_code()
    assert exe is not None
    return exe


def test_real_claude_code_reading_a_png_on_a_real_vl_model_passes_the_audit(
    name: str, path: Path, lm, claude_exe: Path, tmp_path: Path
) -> None:
    """Claude Code's Read of a PNG in its first tool call, then a Read of a file, then the
    answer, served by `tokentrail serve --engine transformers:tiny:NAME+scripted:FILE`: the
    sample carries the image Claude Code sent, passes the audit, and fails it with that image
    swapped for another of its size."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "shot.png").write_bytes(png(224, 140, 21))
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                [
                    {
                        "type": "tool_use",
                        "name": "Read",
                        "input": {"file_path": str(repo / "shot.png")},
                    }
                ],
                [
                    {"type": "text", "text": "A noisy picture. Now calc.py."},
                    {
                        "type": "tool_use",
                        "name": "Read",
                        "input": {"file_path": str(repo / "calc.py")},
                    },
                ],
                [{"type": "text", "text": "shot.png is noise; calc.py sums."}],
            ]
        )
    )
    engine = f"transformers:tiny:{name}+scripted:{script}"
    with serving(script, "--tokenizer", str(path), engine=engine) as served:
        start = time.perf_counter()
        run = run_claude(
            claude_exe,
            "What is in shot.png, and what does calc.py do?",
            base_url=served.url,
            session_id=f"cc-{name}",
            cwd=repo,
            timeout=180,
        )
        elapsed = time.perf_counter() - start
        assert run.returncode == 0, run.stderr[-2000:]
        finished = served.finish(f"cc-{name}")
        checks = served.resume_checks()
    assert checks["mismatch"] == 0 and checks["same"] >= len(finished["ledger"]["turns"])
    ledger = finished["ledger"]
    assert len(ledger["turns"]) >= 3
    assert ledger["trained_tokens"] == ledger["generated_tokens"] > 0
    (sample,) = [Sample.from_dict(s) for s in finished["samples"]]
    (image,) = sample.metadata["images"]
    assert (image["width"], image["height"]) == (224, 140)
    report = recompute_samples(lm, [sample])
    print(f"\nClaude Code {CLAUDE_CODE_VERSION}, tiny {name}: {elapsed:.1f} s\n{report.table()}")
    assert report.trained == ledger["trained_tokens"]
    assert report.within_tolerance == report.trained and report.ok
    swapped = recompute_samples(lm, [swap_image(sample, 0, png(224, 140, 22))])
    print(f"the image swapped\n{swapped.table()}")
    assert not swapped.ok and swapped.max_error > 100 * DEFAULT_TOLERANCE
    # The first turn's reply, sampled before the image was read, is untouched by it.
    trained = sample.prompt_length + np.flatnonzero(sample.loss_mask)
    assert 0 < int((trained < image["offset"]).sum()) <= swapped.within_tolerance < swapped.trained
