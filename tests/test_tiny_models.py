"""The tiny models are ones an engine serves as it serves the real checkpoints: heads as wide as
vLLM's CPU attention takes, and for a VL model the template and `preprocessor_config.json` that
vLLM's own chat render needs to take images, sized as tokentrail sizes them."""

from __future__ import annotations

import io
import json

import jinja2
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor

from support.images import png
from tokentrail.model.tiny import tiny_model
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.text.vision import vision_spec

# vllm 0.32 `v1/attention/backends/cpu_attn.py` `get_supported_head_sizes`.
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
VL = {"qwen2.5-vl": "qwen2-vl", "qwen3-vl": "qwen3-vl"}


@pytest.mark.parametrize("name", ["qwen3", "qwen3-moe", "llama3", *VL])
def test_the_heads_are_as_wide_as_vllms_cpu_attention_takes(name: str) -> None:
    config = json.loads((tiny_model(name) / "config.json").read_text())
    text = config.get("text_config", config)
    if config["model_type"] == "qwen2_5_vl":  # its decoder takes no head_dim
        width = text["hidden_size"] // text["num_attention_heads"]
    else:
        width = text["head_dim"]
    assert width in VLLM_CPU_HEAD_SIZES
    rope = text.get("rope_parameters", {})
    if "mrope_section" in rope:
        assert sum(rope["mrope_section"]) * 2 == width


@pytest.mark.parametrize("name", list(VL))
def test_a_vl_model_renders_images_as_its_family_does(name: str) -> None:
    path = tiny_model(name)
    template = jinja2.Environment().from_string((path / "chat_template.jinja").read_text())
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    content = [image, {"type": "text", "text": "What is it?"}]
    rendered = template.render(
        messages=[{"role": "user", "content": content}], add_generation_prompt=True
    )
    assert rendered == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is it?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # On text it is the family's template, byte for byte.
    text = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    builtin = load_tokenizer(f"builtin:{name}").chat_template
    assert template.render(messages=text) == jinja2.Template(builtin).render(messages=text)


@pytest.mark.parametrize("name", list(VL))
def test_a_vl_models_image_processor_sizes_images_as_tokentrail_does(name: str) -> None:
    spec = vision_spec(VL[name])
    processor = AutoImageProcessor.from_pretrained(tiny_model(name))
    assert type(processor).__name__ == "Qwen2VLImageProcessor"
    for width, height in [(64, 48), (30, 300), (1000, 700)]:
        t, h, w = spec.grid(height, width)
        assert processor.get_number_of_image_patches(height, width, {}) == t * h * w
    assert processor.patch_size == spec.patch_size and processor.merge_size == spec.merge_size
    assert list(processor.image_mean) == list(spec.image_mean)


@pytest.mark.parametrize("name", list(VL))
def test_a_vl_models_pixels_are_the_ones_an_engine_computes(name: str) -> None:
    """The audit's pixels (`VisionSpec.processor`) are, bit for bit, those of the processor an
    engine loads from the model directory: the Pillow backend's resize put a few pixels a level
    of 255 off, and vLLM's logprobs after an image 1.6e-3 nats from the audit's."""
    spec = vision_spec(VL[name])
    engines = AutoImageProcessor.from_pretrained(tiny_model(name))
    for width, height, seed in [(64, 48, 5), (32, 80, 6), (333, 517, 7)]:
        image = Image.open(io.BytesIO(png(width, height, seed=seed))).convert("RGB")
        ours = spec.processor()(images=[image], return_tensors="pt")
        theirs = engines(images=[image], return_tensors="pt")
        assert ours["image_grid_thw"].tolist() == theirs["image_grid_thw"].tolist()
        assert torch.equal(ours["pixel_values"], theirs["pixel_values"]), (width, height)


def test_a_tiny_moe_takes_a_real_moes_routing_shape() -> None:
    """What `benches/gpu_real_engines.py --moe-shape` serves: Qwen3-30B-A3B's routing (48 layers,
    top-8 of 128 experts) over the tiny widths, in a directory of its own; a forward pass
    routes every token through 8 of the 128 experts in each of the 48 layers."""
    from tokentrail.model.forward import CausalLM

    shape = {"num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8}
    path = tiny_model("qwen3-moe", overrides=shape)
    assert path != tiny_model("qwen3-moe")
    config = json.loads((path / "config.json").read_text())
    assert {k: config[k] for k in shape} == shape
    lm = CausalLM(path)
    assert lm.routing is not None
    assert (lm.routing.layers, lm.routing.top_k, lm.routing.num_experts) == (48, 8, 128)
    _, rows = lm.forward([1, 2, 3])
    assert rows is not None and rows.shape == (3, 48, 8)
    assert ((rows >= 0) & (rows < 128)).all()
    assert all(len(set(r)) == 8 for r in rows.reshape(-1, 8).tolist())  # 8 distinct experts


def test_the_command_copies_the_model_where_asked_and_prints_where(tmp_path, capsys) -> None:
    """`python -m tokentrail.model.tiny qwen3 --out DIR`, as docs/getting-started.md runs it
    for vLLM's CPU build: DIR is a whole model directory, the cached one's copy."""
    from tokentrail.model import tiny

    out = tmp_path / "tiny-qwen3"
    assert tiny.main(["qwen3", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    cached = tiny_model("qwen3")
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in cached.iterdir())
    assert (out / "model.safetensors").read_bytes() == (cached / "model.safetensors").read_bytes()
    assert tiny.main(["qwen3"]) == 0
    assert capsys.readouterr().out.strip() == str(cached)
    with pytest.raises(SystemExit):
        tiny.main(["gpt-7"])
