"""One forward pass of a Hugging Face causal LM on CPU, with what an engine reports of it.

`CausalLM` loads a model directory and runs `forward(ids, cache)`: the final hidden states of
the positions fed, and (for a MoE) the experts each router chose for each of them, in SGLang's
`routed_experts` layout (`[positions, num_hidden_layers, top_k]`, dense layers zeros).
`logprobs` turns hidden states into the log-probabilities of given next tokens at a
temperature. A vision-language model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) also takes the
sequence's images (`model.vision`). The engine (`engines.transformers_lm`) and the audit
(`model.audit`) share it, so the audit recomputes with the very code the rollout ran, not
through the engine's cache.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokentrail.core.routing import RoutingShape, model_shapes, read_model_config
from tokentrail.errors import ModelError
from tokentrail.model.vision import ModelImage, VisionInputs

logger = logging.getLogger(__name__)

# Routers of the MoE implementations in transformers (Qwen3-MoE, DeepSeek-V3, GLM-4-MoE,
# gpt-oss) are modules named `...TopkRouter`/`...TopKRouter` that return
# `(router_logits, weights, indices)`; `indices` are the top-k experts of every token.
_ROUTER_CLASS = re.compile(r"Top[kK]Router$")
_LAYER = re.compile(r"\.layers\.(\d+)\.")
# `TOKENTRAIL_TORCH_THREADS` caps torch's intra-op threads for every in-process model.
THREADS_ENV = "TOKENTRAIL_TORCH_THREADS"
# Positions fed at once after a cache (the first forward of a prompt is one pass).
PREFILL_CHUNK = 2048


def set_threads(threads: int | None = None) -> None:
    """Cap torch's CPU threads: `threads`, else `$TOKENTRAIL_TORCH_THREADS`, else torch's own."""
    import torch

    if threads is None:
        env = os.environ.get(THREADS_ENV)
        threads = int(env) if env else None
    if threads is not None and threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _torch() -> Any:
    try:
        import torch
        import transformers  # noqa: F401 - checked here so the error names both
    except ImportError as exc:
        raise ModelError(
            "an in-process model needs torch and transformers: pip install 'tokentrail[model]'"
        ) from exc
    return torch


class CausalLM:
    """A model directory loaded for inference in float32 on CPU.

    Calls are serialized by a lock: the model is shared, and the CPU has no room for two
    forward passes at once anyway.
    """

    def __init__(self, path: str | os.PathLike[str], *, threads: int | None = None) -> None:
        torch = _torch()
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        self.path = Path(path)
        config = read_model_config(self.path)
        set_threads(threads)
        # A vision-language checkpoint loads as the model that takes images, its decoder and
        # head the same `model.model` / `lm_head` as a causal LM's.
        loader = AutoModelForImageTextToText if "vision_config" in config else AutoModelForCausalLM
        try:
            model = loader.from_pretrained(self.path, dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise ModelError(f"cannot load the model at {self.path}: {exc}") from None
        self.model = model.eval()
        self.config = config
        self.vocab_size = int(model.config.get_text_config().vocab_size)
        self.vision: VisionInputs | None = (
            VisionInputs(model, config, str(self.path)) if "vision_config" in config else None
        )
        self.lock = threading.Lock()
        self.routing: RoutingShape | None = model_shapes(config)[0]
        self._routers: list[tuple[int, Any]] = []
        for name, module in model.named_modules():
            if _ROUTER_CLASS.search(type(module).__name__):
                found = _LAYER.search(f".{name}.")
                if found is None:
                    raise ModelError(f"router {name} of {self.path} is in no decoder layer")
                self._routers.append((int(found.group(1)), module))
        if self._routers and self.routing is None:
            raise ModelError(f"{self.path} has routers but its config names no expert count")
        self._captured: list[tuple[int, Any]] | None = None
        # The decoder the forward pass runs: a VL model's language model takes the embeddings
        # `model.vision` makes (its `model.model` would run the tower on every call).
        self._decoder = model.model.language_model if self.vision is not None else model.model
        # transformers 5 renames `past_key_values` to `cache` (the old name warns until 5.40).
        params = inspect.signature(self._decoder.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        for layer, module in self._routers:
            module.register_forward_hook(self._hook(layer))

    @property
    def is_moe(self) -> bool:
        return bool(self._routers)

    def _hook(self, layer: int) -> Any:
        def capture(_module: Any, _inputs: Any, output: Any) -> None:
            if self._captured is not None:
                self._captured.append((layer, output[2]))

        return capture

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def forward(
        self,
        ids: Sequence[int],
        cache: Any = None,
        *,
        images: Sequence[ModelImage] = (),
        context: Sequence[int] = (),
    ) -> tuple[Any, np.ndarray | None]:
        """Feed `ids` (after what `cache` holds, if given; the cache is extended).

        A vision model also reads `images`, those of the whole sequence (`context + ids`) in
        token order, and `context`, the tokens `cache` holds (their rope positions and images
        decide those of `ids`); a text model takes no images and ignores `context`.

        Returns the final hidden states `[len(ids), hidden]` and, for a MoE, the routed
        experts `[len(ids), layers, top_k]` int32 (None for a dense model).
        """
        if cache is not None and len(ids) > PREFILL_CHUNK:
            # Chunked, as engines prefill: attention over a cache takes an explicit mask of
            # (new positions x cached positions), which one long chunk would make huge.
            parts = []
            for i in range(0, len(ids), PREFILL_CHUNK):
                before = [*context, *ids[:i]] if self.vision is not None else context
                parts.append(
                    self.forward(ids[i : i + PREFILL_CHUNK], cache, images=images, context=before)
                )
            torch = _torch()
            hidden = torch.cat([h for h, _ in parts])
            chunk_rows = [r for _, r in parts if r is not None]
            return hidden, (np.concatenate(chunk_rows) if chunk_rows else None)
        torch = _torch()
        if not ids:
            raise ModelError("a forward pass needs at least one token")
        tensor = torch.tensor([list(ids)], dtype=torch.long)
        if int(tensor.max()) >= self.vocab_size or int(tensor.min()) < 0:
            raise ModelError(
                f"a token id is outside the model's vocabulary (0..{self.vocab_size - 1})"
            )
        inputs: dict[str, Any] = {"input_ids": tensor}
        if self.vision is not None:
            held = 0 if cache is None else cache.get_seq_length()
            if len(context) != held:
                raise ModelError(f"{len(context)} context tokens for a cache of {held}")
            inputs = self.vision.inputs([*context, *ids], held, images)
        elif images:
            raise ModelError(f"{self.path} is a text model: it takes no images")
        self._captured = [] if self._routers else None
        try:
            with torch.inference_mode():
                kwargs = {self._cache_arg: cache, "use_cache": cache is not None}
                out = self._decoder(**inputs, **kwargs)
            captured = self._captured
        finally:
            self._captured = None
        hidden = out.last_hidden_state[0]
        rows: np.ndarray | None = None
        if captured is not None:
            assert self.routing is not None
            rows = np.zeros((len(ids), self.routing.layers, self.routing.top_k), dtype=np.int32)
            for layer, indices in captured:
                rows[:, layer, :] = indices.reshape(len(ids), -1).numpy()
        return hidden, rows

    def logits(self, hidden: Any) -> Any:
        """The next-token logits of hidden states `[n, hidden]`, float32 `[n, vocab]`."""
        torch = _torch()
        with torch.inference_mode():
            return self.model.lm_head(hidden).float()

    def logprobs(self, hidden: Any, targets: Sequence[int], temperature: float = 1.0) -> np.ndarray:
        """log p(targets[i] | position i) at `temperature` (<= 0: the unscaled logits, as a
        greedy engine reports them), float64 from float32 logits."""
        torch = _torch()
        logits = self.logits(hidden)
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1)
        index = torch.tensor(list(targets), dtype=torch.long)[:, None]
        return logp.gather(1, index)[:, 0].double().numpy()


def crop(cache: Any, length: int) -> None:
    """Cut `cache` back to its first `length` positions."""
    held = cache.get_seq_length()
    if held > length:
        cache.crop(length - held)
