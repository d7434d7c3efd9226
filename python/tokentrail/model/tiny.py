"""Tiny real architectures with seeded random weights and the real `builtin:` vocabularies.

`tiny_model("qwen3-moe")` is a Hugging Face model directory (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json) of a
Qwen3-MoE with a small hidden size and the full Qwen3 vocabulary: every code path that takes a
model directory (the `transformers` engine, `--tokenizer DIR`, `--model-config DIR`, the audit,
SGLang/vLLM with `--load-format dummy`) takes it. `qwen2.5-vl` and `qwen3-vl` are
vision-language models (a tiny vision tower with its family's real patch sizes) that take the
adapter's images. Built once per (config, seed, library versions) and cached under
`$TOKENTRAIL_CACHE/tiny-models/`, like the builtin vocabularies.

    python -m tokentrail.model.tiny NAME [--out DIR]

builds one (offline: the vocabularies ship with tokentrail) and prints its directory, or copies
it to DIR: a model an engine serves on a CPU, to try a deployment without a GPU.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from tokentrail.errors import ModelError
from tokentrail.model.vision import VISION_ENCODERS
from tokentrail.text.tokenizer import LoadedTokenizer, cache_root, load_tokenizer
from tokentrail.text.vision import QwenVision, vision_spec

logger = logging.getLogger(__name__)

# Bump when the way a tiny model is assembled changes, so stale caches are ignored.
BUILD_VERSION = 3
DEFAULT_SEED = 0

# The attention heads' width: the smallest vLLM's CPU attention takes (its supported sizes are
# 32, 64, 80, ...), so that `vllm serve` runs the tiny models too. M-RoPE sections add up to half.
HEAD_DIM = 32

# Shared by every tiny architecture: small enough that a 20K-token prompt is a second on one
# core, large enough that the logprobs and the routing depend on the context.
_COMMON: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": True,
    # Weights ten times the usual spread, so that the next-token distribution is far from
    # uniform and one changed context token moves the logprobs well past float32 noise.
    "initializer_range": 0.2,
    "torch_dtype": "float32",
}


@dataclass(frozen=True)
class TinySpec:
    """One tiny architecture: the HF `model_type`, the builtin vocabulary it speaks, and the
    config fields beyond the common ones."""

    model_type: str
    architecture: str
    tokenizer: str
    config: Mapping[str, Any] = field(default_factory=dict)
    # A vision-language model's `vision_config` (None: a text model). The decoder's fields go
    # in its `text_config`; the vocabulary's vision tokens are the image token ids.
    vision: Mapping[str, Any] | None = None


TINY_MODELS: dict[str, TinySpec] = {
    "qwen3": TinySpec("qwen3", "Qwen3ForCausalLM", "builtin:qwen3", {"head_dim": HEAD_DIM}),
    "qwen3-moe": TinySpec(
        "qwen3_moe",
        "Qwen3MoeForCausalLM",
        "builtin:qwen3",
        {
            "head_dim": HEAD_DIM,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        },
    ),
    "llama3": TinySpec(
        "llama",
        "LlamaForCausalLM",
        "builtin:llama3",
        {"head_dim": HEAD_DIM, "rope_theta": 500000.0},
    ),
    # DeepSeek-V3's MLA attention and grouped sigmoid router, its first layer dense
    # (`first_k_dense_replace`), over DeepSeek's own vocabulary and the V3.1 chat template.
    "deepseek-v3": TinySpec(
        "deepseek_v3",
        "DeepseekV3ForCausalLM",
        "builtin:deepseek-v3.1",
        {
            "num_hidden_layers": 3,
            "num_key_value_heads": 2,  # MLA: one latent per head
            "first_k_dense_replace": 1,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "n_group": 2,
            "topk_group": 1,
            "moe_intermediate_size": 32,
            "kv_lora_rank": 16,
            "q_lora_rank": 24,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
            "norm_topk_prob": True,
            "routed_scaling_factor": 1.0,
            "rope_interleave": True,
        },
    ),
    # Qwen2.5-VL: a two-block vision tower (one windowed, one full attention) over Qwen2-VL's
    # 14-pixel patches, 2x2 merge and 2-frame temporal patches (`text.vision`'s "qwen2-vl", so
    # that the adapter's token counts are the tower's), M-RoPE over the 32-wide heads.
    "qwen2.5-vl": TinySpec(
        "qwen2_5_vl",
        "Qwen2_5_VLForConditionalGeneration",
        "builtin:qwen2.5-vl",
        {
            # Qwen2.5-VL's decoder takes no `head_dim`: its heads are hidden_size / heads wide.
            "num_attention_heads": _COMMON["hidden_size"] // HEAD_DIM,
            "head_dim": HEAD_DIM,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "mrope_section": [4, 6, 6],
            },
        },
        vision={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 32,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [1],
            "initializer_range": 0.2,
        },
    ),
    # Qwen3-VL: Qwen3-VL's 16-pixel patches (`text.vision`'s "qwen3-vl"), learned position
    # embeddings interpolated to the grid, the tower's first block's features fed to the first
    # decoder layer (deepstack), interleaved M-RoPE.
    "qwen3-vl": TinySpec(
        "qwen3_vl",
        "Qwen3VLForConditionalGeneration",
        "builtin:qwen3-vl",
        {
            "head_dim": HEAD_DIM,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5000000.0,
                "mrope_section": [8, 4, 4],
                "mrope_interleaved": True,
            },
        },
        vision={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 32,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 256,
            "deepstack_visual_indexes": [0],
            "initializer_range": 0.2,
        },
    ),
}

# The vision tokens a VL config names by id, by the vocabulary's token text.
_VISION_TOKENS = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
}


def tiny_names() -> list[str]:
    return sorted(TINY_MODELS)


def tiny_config(name: str, tokenizer: LoadedTokenizer) -> dict[str, Any]:
    """The config.json fields of tiny model `name` over `tokenizer` (its vocabulary size and
    special token ids)."""
    spec = _spec(name)
    config: dict[str, Any] = {
        "model_type": spec.model_type,
        "architectures": [spec.architecture],
        **_COMMON,
        **spec.config,
        "vocab_size": tokenizer.vocab_size,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if tokenizer.bos_token_id is not None:
        config["bos_token_id"] = tokenizer.bos_token_id
    if tokenizer.pad_token_id is not None:
        config["pad_token_id"] = tokenizer.pad_token_id
    if spec.vision is None:
        return config
    outer = ("model_type", "architectures", "torch_dtype")
    text = {k: v for k, v in config.items() if k not in outer}
    return {
        "model_type": spec.model_type,
        "architectures": [spec.architecture],
        "text_config": text,
        "vision_config": dict(spec.vision),
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "vocab_size": tokenizer.vocab_size,
        "eos_token_id": tokenizer.eos_token_id,
        **{key: tokenizer.token_id(token) for key, token in _VISION_TOKENS.items()},
    }


def tiny_model(
    name: str,
    *,
    seed: int = DEFAULT_SEED,
    cache_dir: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Path:
    """The directory of tiny model `name` (`tiny_names()`), built on first use. `overrides`:
    config fields over the tiny ones (a real MoE's layer and expert counts, as
    `benches/gpu_real_engines.py --moe-shape` asks), a directory of its own."""
    fields = json.dumps(dict(overrides or {}), sort_keys=True)
    path = _tiny_model(name, seed, str(cache_root(cache_dir)), fields)
    if not (path / "model.safetensors").is_file():  # removed since: build it again
        _tiny_model.cache_clear()
        path = _tiny_model(name, seed, str(cache_root(cache_dir)), fields)
    return path


@functools.lru_cache(maxsize=32)
def _tiny_model(name: str, seed: int, cache_dir: str, overrides: str = "{}") -> Path:
    # Cached in process: finding the directory loads the vocabulary, which takes a second.
    import torch
    import transformers

    tokenizer = load_tokenizer(_spec(name).tokenizer, cache_dir)
    config = {**tiny_config(name, tokenizer), **json.loads(overrides)}
    key = json.dumps(
        [config, seed, BUILD_VERSION, torch.__version__, transformers.__version__], sort_keys=True
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    target = cache_root(cache_dir) / "tiny-models" / f"{name}-{digest}"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built in a scratch directory and renamed into place, so that processes building at once
    # never read a half-written model.
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}-"))
    try:
        _build(scratch, config, tokenizer, seed)
        try:
            scratch.rename(target)
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    logger.info("built tiny model %s at %s", name, target)
    return target


def _build(path: Path, config: dict[str, Any], tokenizer: LoadedTokenizer, seed: int) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    hf_config = AutoConfig.for_model(
        **{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    )
    hf_config.architectures = config["architectures"]
    torch.manual_seed(seed)
    loader = AutoModelForImageTextToText if "vision_config" in config else AutoModelForCausalLM
    model = loader.from_config(hf_config, dtype=torch.float32)
    # Routers start at zero in some implementations (every expert tied): draw them too.
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 1 and (name.endswith("gate.weight") or "router" in name):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    model.save_pretrained(path)
    # transformers may save a field under its own newer name (Qwen3-MoE's `num_experts` as
    # `num_local_experts`); keep the names the checkpoint's own family uses too, so that an
    # engine built against another transformers (SGLang, vLLM) reads the same model.
    saved = json.loads((path / "config.json").read_text())
    saved.update({k: v for k, v in config.items() if k not in saved and k != "torch_dtype"})
    (path / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True))
    (path / "tokenizer.json").write_text(tokenizer.tokenizer.to_str(), encoding="utf-8")
    vision = config.get("vision_config")
    template = tokenizer.chat_template if vision is None else _vision_template()
    (path / "chat_template.jinja").write_text(template, encoding="utf-8")
    if vision is not None:
        # The image processor an engine's own render sizes images with: the family's, at the
        # tower's patch and merge sizes (what `text.vision` sizes them by too).
        processor = _preprocessor_config(config["model_type"], vision)
        (path / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
    tok_config: dict[str, Any] = {"eos_token": tokenizer.eos_token}
    if tokenizer.bos_token is not None:
        tok_config["bos_token"] = tokenizer.bos_token
    if tokenizer.pad_token is not None:
        tok_config["pad_token"] = tokenizer.pad_token
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    generation = {"eos_token_id": sorted(tokenizer.end_token_ids)}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))


def _vision_template() -> str:
    """Qwen3's template with the VL models' image and video parts (`qwen_vl.jinja`)."""
    templates = resources.files("tokentrail.text").joinpath("templates")
    return templates.joinpath("qwen_vl.jinja").read_text("utf-8")


def _preprocessor_config(model_type: str, vision: Mapping[str, Any]) -> dict[str, Any]:
    """`preprocessor_config.json` of a Qwen VL checkpoint: `Qwen2VLImageProcessor` with the
    family's pixel bounds, mean and std (`text.vision`), the tower's patch sizes."""
    spec = vision_spec(VISION_ENCODERS[model_type])
    assert isinstance(spec, QwenVision)
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": _PROCESSOR_CLASS[model_type],
        "do_convert_rgb": True,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(spec.image_mean),
        "image_std": list(spec.image_std),
        "min_pixels": spec.min_pixels,
        "max_pixels": spec.max_pixels,
        "size": {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels},
        "patch_size": vision["patch_size"],
        "temporal_patch_size": vision["temporal_patch_size"],
        "merge_size": vision["spatial_merge_size"],
    }


_PROCESSOR_CLASS = {"qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}


def _spec(name: str) -> TinySpec:
    try:
        return TINY_MODELS[name]
    except KeyError:
        raise ModelError(f"no tiny model {name!r}; known: {', '.join(tiny_names())}") from None


def parser() -> argparse.ArgumentParser:
    """The arguments of `python -m tokentrail.model.tiny`."""
    parser = argparse.ArgumentParser(
        prog="python -m tokentrail.model.tiny",
        description="Build a tiny model (random weights, a real vocabulary) and print its "
        "directory: a model vLLM or SGLang serve on a CPU.",
    )
    parser.add_argument("name", choices=tiny_names(), help="the architecture")
    parser.add_argument("--out", type=Path, help="copy the model directory here")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="the weights' seed")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Build tiny model NAME; print its directory, or copy it to `--out DIR` and print that."""
    args = parser().parse_args(argv)
    path = tiny_model(args.name, seed=args.seed)
    if args.out is not None:
        shutil.copytree(path, args.out, dirs_exist_ok=True)
        path = args.out
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
