"""The tiny models are ones an engine serves as it serves the real checkpoints: heads as wide as
vLLM's CPU attention takes, and for a VL model the template and `preprocessor_config.json` that
vLLM's own chat render needs to take images, sized as tokentrail sizes them."""

from __future__ import annotations

import json

import jinja2
import pytest
from transformers import AutoImageProcessor

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
