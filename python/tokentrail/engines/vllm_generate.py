"""vLLM's tokens-in/tokens-out `/inference/v1/generate`, for a prompt with images: the images
processed by `/v1/chat/completions/render`, then sampled from tokentrail's own token ids.

`/v1/completions` takes token ids and nothing beside them: its request model is
`extra="allow"`, so a `multi_modal_data` key is dropped with a logged warning and the image pad
tokens would run as plain text embeddings. `/inference/v1/generate` (vllm
`entrypoints/serve/disagg`) takes `token_ids` with `features`: per modality the items' hashes
(`mm_hashes`), where each item's tokens are in `token_ids` (`mm_placeholders`, offset and
length of its `<|image_pad|>` run, already expanded: vLLM expands nothing on this route) and
each item's processed tensors (`kwargs_data`, base64 of vLLM's msgpack of a
`MultiModalKwargsItem`; None for an item its processor cache holds). tokentrail builds no
tensors: it renders a chat of the images alone, keeps their hashes and tensors, and places
them at its own prompt's image runs, after checking that vLLM sized each image as tokentrail
did (else the recorded prompt would not be the one the engine ran). The answer is put in
`/v1/completions`' shape, so that one parser reads both routes.
"""

from __future__ import annotations

from typing import Any

from tokentrail.engines.base import GenerateRequest, token_list
from tokentrail.engines.bound import ENVELOPE_BYTES, PROMPT_ID_BYTES, base64_len
from tokentrail.errors import EngineError
from tokentrail.messages import ImageInput
from tokentrail.text.vision import image_positions

__all__ = [
    "GENERATE_PATH",
    "RENDER_PATH",
    "as_completion",
    "generate_body",
    "placed_features",
    "render_body",
    "render_limit",
    "sampling_params",
]

RENDER_PATH = "/v1/chat/completions/render"
GENERATE_PATH = "/inference/v1/generate"
# The most bytes one patch's pixel values take as float32: Qwen3-VL's (3 channels x 2 frames
# x 16 x 16), the largest patch of the encoders tokentrail sizes.
PATCH_BYTES = 3 * 2 * 16 * 16 * 4
# A rendered chat's own tokens beside its images' (the template, a few per image).
RENDER_TEMPLATE_TOKENS = 4096


def render_body(model: str, images: list[ImageInput]) -> dict[str, Any]:
    """A chat of `images` alone, in order, as data URLs (`ChatCompletionRequest`)."""
    content = [{"type": "image_url", "image_url": {"url": i.data_url()}} for i in images]
    return {"model": model, "messages": [{"role": "user", "content": content}]}


def render_limit(images: list[ImageInput]) -> int:
    """The most bytes a legitimate render of `images` takes: each image's pixel values (its
    grid's patches) in base64, and the rendered ids."""
    patches = sum(t * h * w for t, h, w in (i.grid_thw for i in images))
    ids = RENDER_TEMPLATE_TOKENS + sum(i.tokens for i in images)
    size = ENVELOPE_BYTES + base64_len(patches * PATCH_BYTES) + PROMPT_ID_BYTES * ids
    return size + size // 8


def placed_features(rendered: Any, req: GenerateRequest) -> dict[str, Any]:
    """The render's image items placed at `req`'s image runs: `MultiModalFeatures` for
    `/inference/v1/generate`. Raises `EngineError` for a render that is not of these images
    or that sizes one of them differently from tokentrail."""
    features = rendered.get("features") if isinstance(rendered, dict) else None
    if not isinstance(features, dict):
        raise EngineError(
            f"vllm {RENDER_PATH} answered without features (a server whose model takes no images?)"
        )
    hashes = _per_image(features, "mm_hashes")
    placeholders = _per_image(features, "mm_placeholders")
    kwargs = features.get("kwargs_data")
    items = None if kwargs is None else _per_image(features, "kwargs_data")
    runs = image_positions(token_list(req.input_ids), req.image_pad_id)
    n = len(req.images)
    if not (len(hashes) == len(placeholders) == n == len(runs)) or (
        items is not None and len(items) != n
    ):
        raise EngineError(
            f"vllm rendered {len(hashes)} images for the {n} of the prompt, which holds "
            f"{len(runs)} image token runs"
        )
    for k, (place, image, run) in enumerate(zip(placeholders, req.images, runs, strict=True)):
        size = place.get("length") if isinstance(place, dict) else None
        _, length = run
        if size != image.tokens or length != image.tokens:
            raise EngineError(
                f"vllm sizes image {k} ({image.width}x{image.height}) as {size} tokens, "
                f"tokentrail as {image.tokens}: the server's image processor settings "
                "(--mm-processor-kwargs) are not the family's"
            )
    out: dict[str, Any] = {
        "mm_hashes": {"image": hashes},
        "mm_placeholders": {"image": [{"offset": at, "length": n} for at, n in runs]},
        "kwargs_data": None if items is None else {"image": items},
    }
    return out


def _per_image(features: dict[str, Any], key: str) -> list[Any]:
    value = features.get(key)
    items = value.get("image") if isinstance(value, dict) else None
    if not isinstance(items, list):
        raise EngineError(f"vllm {RENDER_PATH} answered without features.{key}.image")
    return items


def sampling_params(req: GenerateRequest) -> dict[str, Any]:
    """vLLM's `SamplingParams` of a request: the keys both routes take, top level in
    `/v1/completions`, under `sampling_params` in `/inference/v1/generate`."""
    s = req.sampling
    params: dict[str, Any] = {
        "max_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "stop": list(s.stop),
        # 0 top alternatives: vLLM still returns the sampled token's own logprob.
        "logprobs": 0,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }
    if s.seed is not None:
        params["seed"] = s.seed
    if req.constraint is not None:
        params["structured_outputs"] = {"regex": req.constraint.regex}
    if req.replay.routed_start is not None:
        # Routing itself is server-wide (`--enable-return-routed-experts`); this only says
        # from where (clamped to the prompt by vLLM).
        params["routed_experts_prompt_start"] = req.replay.routed_start
    return params


def generate_body(
    req: GenerateRequest, model: str, features: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`GenerateRequest` of `/inference/v1/generate`: the ids, the placed images (none for a
    text prompt) and vLLM's own `SamplingParams`."""
    body = {
        "request_id": req.request_id,
        "model": model,
        "token_ids": token_list(req.input_ids),
        "sampling_params": sampling_params(req),
        "stream": False,
    }
    if features is not None:
        body["features"] = features
    return body


def as_completion(obj: Any) -> dict[str, Any]:
    """A `/inference/v1/generate` answer or stream chunk in `/v1/completions`' shape: each
    choice's `logprobs.content[i].logprob` as `logprobs.token_logprobs`, the rest as it is."""
    if not isinstance(obj, dict):
        raise EngineError("vllm generate answer is not an object")
    choices = obj.get("choices")
    if not isinstance(choices, list):
        raise EngineError("vllm generate answer has no choices")
    out = dict(obj)
    out["choices"] = [_choice(c) for c in choices]
    return out


def _choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if lp is None or content is None:
        return choice
    if not isinstance(content, list) or not all(isinstance(e, dict) for e in content):
        raise EngineError("vllm generate answer has malformed choices[0].logprobs.content")
    if not all("logprob" in e for e in content):
        raise EngineError("vllm generate answer has a logprobs.content entry without logprob")
    values = [e["logprob"] for e in content]
    return {**choice, "logprobs": {"token_logprobs": values}}
