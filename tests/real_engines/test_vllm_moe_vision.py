"""A real vLLM (CPU build) serving the tiny Qwen3-MoE, then the tiny Qwen3-VL, behind
`tokentrail serve --engine vllm://`: an SDK session on each records exactly what vLLM answered
and passes the recompute audit; the VL model takes an image turn through vLLM's own render
(the model's template and `preprocessor_config.json`) and tokens routes, whose answer brings
the weight versions. vLLM's CPU build cannot return routed experts (Model Runner V2 needs
Triton), so the MoE samples carry none and the audit checks logprobs only.
"""

from __future__ import annotations

from pathlib import Path

import anthropic
import pytest

from support.images import image_block, png
from support.real_sessions import answered, check_logprobs_are_the_engines, run_session
from support.serve import serving
from support.vllm_server import recording
from tokentrail.model.audit import DEFAULT_TOLERANCE, recompute_samples
from tokentrail.trajectory.sample import Sample


def audited(
    samples: list[Sample], model_dir: Path, checked: int, tolerance: float = DEFAULT_TOLERANCE
) -> None:
    report = recompute_samples(model_dir, samples, tolerance=tolerance)
    print(report.table())
    assert report.trained == checked > 0
    assert report.within_tolerance == report.trained and report.max_error <= tolerance


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_session_on_the_moe_model(stream: bool, vllm_servers) -> None:
    vllm = vllm_servers.get("qwen3-moe")
    with (
        recording(vllm.url) as rec,
        serving(
            Path(), "--tokenizer", str(vllm.model_dir), "--engine-stream" if stream else
            "--no-engine-stream", engine="vllm://" + rec.url.removeprefix("http://"),
        ) as served,
    ):  # fmt: skip
        run_session(served.url, "messages", "moe", stream=stream)
        finished = served.finish("moe")
    samples = [Sample.from_dict(s) for s in finished["samples"]]
    assert all(s.routed_experts is None for s in samples)
    checked = check_logprobs_are_the_engines(samples, answered(rec.exchanges))
    assert all(s.metadata["weight_versions"] for s in samples)
    audited(samples, vllm.model_dir, checked)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_image_turn_on_the_vl_model(stream: bool, vllm_servers) -> None:
    vllm = vllm_servers.get("qwen3-vl")
    with (
        recording(vllm.url) as rec,
        serving(
            Path(), "--tokenizer", str(vllm.model_dir), "--engine-stream" if stream else
            "--no-engine-stream", engine="vllm://" + rec.url.removeprefix("http://"),
        ) as served,
    ):  # fmt: skip
        client = anthropic.Anthropic(base_url=served.url, api_key="vl", max_retries=0)
        content = [image_block(png(64, 48, seed=5)), {"type": "text", "text": "What is it?"}]
        messages = [{"role": "user", "content": content}]
        first = client.messages.create(model="m", max_tokens=6, messages=messages)
        messages += [
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {
                "role": "user",
                "content": [image_block(png(32, 80, seed=6)), {"type": "text", "text": "And?"}],
            },
        ]
        client.messages.create(model="m", max_tokens=6, messages=messages)
        finished = served.finish("vl")
    (render, *_) = rec.to("/v1/chat/completions/render")
    assert render.status == 200, render.answer[:500]
    calls = rec.to("/inference/v1/generate")
    assert len(calls) == 2 and all(c.status == 200 for c in calls)
    assert all(bool(c.body["stream"]) is stream for c in calls)
    samples = [Sample.from_dict(s) for s in finished["samples"]]
    assert sum(len(s.metadata["images"]) for s in samples) >= 2
    checked = check_logprobs_are_the_engines(samples, answered(rec.exchanges))
    for sample in samples:
        assert sample.metadata["weight_versions"][0]["version"] == "default"
    # The tokens after an image are held to the text tolerance: with the audit's pixels from
    # the processor vLLM loads (torchvision's resize, not Pillow's), they agree within 2e-6
    # nats, as text-only turns do (docs/engines/vllm.md).
    audited(samples, vllm.model_dir, checked)
