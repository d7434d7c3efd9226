"""Images into a vision-language model's forward pass: pixels, embeddings and M-RoPE positions.

`VisionInputs` wraps a loaded Qwen2-VL / Qwen2.5-VL / Qwen3-VL (`..ForConditionalGeneration`):
for a stretch of a token sequence it gives the decoder's inputs: the input embeddings, each
image's placeholder tokens replaced by the vision tower's output for that image (pixels from
the family's own image processor, `text.vision.VisionSpec.processor`, the very one that sized
its tokens), Qwen3-VL's "deepstack" features that its first decoder layers add at the image
positions, and the model's own 3-D rope positions (`get_rope_index` over the whole sequence
and every image's grid). All are computed for the whole sequence and cut to the stretch, so a
KV-cached turn that feeds only its new tokens (even from inside an image's run) sees what one
forward pass over everything would.
"""

from __future__ import annotations

import hashlib
import io
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from tokentrail.errors import ModelError
from tokentrail.text.vision import QwenVision, VisionSpec, vision_spec

# The checkpoints taken, by `model_type`, with the image processor (`text.vision`) of each.
VISION_ENCODERS = {"qwen2_vl": "qwen2-vl", "qwen2_5_vl": "qwen2-vl", "qwen3_vl": "qwen3-vl"}
# Those whose tower also feeds the first decoder layers (Qwen3-VL's deepstack).
DEEPSTACK = frozenset({"qwen3_vl"})
# Images whose tower output is kept (by their bytes' digest): a harness resends every earlier
# image each turn, and a cached turn needs the embeddings of images it does not feed again.
MAX_HELD_IMAGES = 64


class ModelImage(Protocol):
    """What the forward pass reads of an image (`messages.ImageInput` has it): its encoded
    bytes and the processor grid the prompt's tokens were sized by."""

    @property
    def data(self) -> bytes: ...

    @property
    def grid_thw(self) -> tuple[int, int, int]: ...


def image_runs(ids: np.ndarray, pad_id: int) -> list[tuple[int, int]]:
    """(start, length) of each run of `pad_id` in `ids` (`text.vision.image_positions`, on an
    array)."""
    is_pad = np.concatenate([[False], ids == pad_id, [False]])
    edges = np.flatnonzero(is_pad[1:] != is_pad[:-1])
    return [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


class VisionInputs:
    """The vision side of a loaded VL model (module docstring)."""

    def __init__(self, model: Any, config: Mapping[str, Any], where: str) -> None:
        model_type = config.get("model_type")
        encoder = VISION_ENCODERS.get(str(model_type))
        if encoder is None:
            raise ModelError(
                f"{where}: images into a {model_type} model are not supported in process; "
                f"supported: {', '.join(VISION_ENCODERS)}"
            )
        spec = vision_spec(encoder)
        assert isinstance(spec, QwenVision)  # the in-process VL models are Qwen's
        vision = model.config.vision_config
        given = (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size)
        wanted = (spec.patch_size, spec.merge_size, spec.temporal_patch_size)
        if given != wanted:
            raise ModelError(
                f"{where}: the vision tower's patch, merge and temporal sizes {given} are not "
                f"{spec.name}'s {wanted}: the prompts' image token counts would not fit it"
            )
        self.spec: VisionSpec = spec
        self.model = model
        self.pad_id = int(model.config.image_token_id)
        self.deepstack = model_type in DEEPSTACK
        # By image digest: the tower's output and its deepstack features.
        self._held: OrderedDict[str, tuple[Any, list[Any]]] = OrderedDict()

    def check(self, tokens: Sequence[int], images: Sequence[ModelImage]) -> None:
        """Raise `ModelError` unless `tokens` hold one run of image tokens per image of
        `images`, in order, each as long as its grid makes it."""
        runs = image_runs(np.asarray(tokens, dtype=np.int64), self.pad_id)
        if len(runs) != len(images):
            raise ModelError(
                f"the tokens hold {len(runs)} image runs (<|image_pad|>) for {len(images)} images"
            )
        self._check_lengths(runs, images, len(tokens) + 1)

    def _check_lengths(
        self, runs: list[tuple[int, int]], images: Sequence[ModelImage], end: int
    ) -> None:
        for k, ((at, length), image) in enumerate(zip(runs, images, strict=False)):
            want = self.spec.tokens(image.grid_thw)
            # A run reaching `end` may go on past it (a chunk ending inside an image).
            if length != want and not (at + length == end and length < want):
                raise ModelError(
                    f"image {k}: its run holds {length} tokens, its grid {image.grid_thw} {want}"
                )

    def inputs(
        self, tokens: Sequence[int], start: int, images: Sequence[ModelImage]
    ) -> dict[str, Any]:
        """The decoder's inputs for `tokens[start:]` (`n` positions), `tokens` being the whole
        sequence so far and `images` its images in token order (later ones, of tokens still to
        come, are left for later): `inputs_embeds` `[1, n, hidden]`, `position_ids`
        `[3, 1, n]` and, for a deepstack model, `visual_pos_masks` `[1, n]` with
        `deepstack_visual_embeds` (one `[image positions, hidden]` per layer it feeds). Raises
        `ModelError` when there are fewer images than runs, or a run's length is not its
        image's."""
        import torch

        ids = np.asarray(tokens, dtype=np.int64)
        runs = image_runs(ids, self.pad_id)
        if len(runs) > len(images):
            raise ModelError(
                f"the tokens hold {len(runs)} image runs (<|image_pad|>) for {len(images)} images"
            )
        images = images[: len(runs)]
        self._check_lengths(runs, images, len(ids))
        if runs and runs[-1][0] + runs[-1][1] == len(ids):
            # The last image's run goes on past these tokens: its positions are the image's
            # whole grid's, so they are computed with the run filled out.
            missing = self.spec.tokens(images[-1].grid_thw) - runs[-1][1]
            ids = np.concatenate([ids, np.full(missing, self.pad_id, dtype=np.int64)])
        full = torch.from_numpy(ids)[None]
        grids = torch.tensor([list(i.grid_thw) for i in images], dtype=torch.long)
        with torch.inference_mode():
            positions, _ = self.model.model.get_rope_index(
                full,
                (full == self.pad_id).int(),
                image_grid_thw=grids if len(images) else None,
            )
            embeds = self.model.model.get_input_embeddings()(full[:, start : len(tokens)])
            deep: list[list[Any]] = []
            for (at, length), image in zip(runs, images, strict=True):
                lo, hi = max(at, start), min(at + length, len(tokens))
                if lo < hi:
                    features, layers = self._features(image)
                    embeds[0, lo - start : hi - start] = features[lo - at : hi - at]
                    deep.append([f[lo - at : hi - at] for f in layers])
        out = {"inputs_embeds": embeds, "position_ids": positions[:, :, start : len(tokens)]}
        if self.deepstack and deep:
            out["visual_pos_masks"] = full[:, start : len(tokens)] == self.pad_id
            out["deepstack_visual_embeds"] = [torch.cat(layer) for layer in zip(*deep, strict=True)]
        return out

    def _features(self, image: ModelImage) -> tuple[Any, list[Any]]:
        """The tower's output for `image`, `[tokens, hidden]`, and its deepstack features (one
        such per layer they feed; none for Qwen2-VL), computed once per image bytes."""
        import torch

        digest = hashlib.sha256(image.data).hexdigest()
        held = self._held.get(digest)
        if held is not None:
            self._held.move_to_end(digest)
            return held
        pixels, grid = self.pixels(image)
        with torch.inference_mode():
            out = self.model.model.get_image_features(pixels, grid, return_dict=True)
        features = (
            out.pooler_output[0],
            ([f[0] for f in out.deepstack_features] if self.deepstack else []),
        )
        self._held[digest] = features
        while len(self._held) > MAX_HELD_IMAGES:
            self._held.popitem(last=False)
        return features

    def pixels(self, image: ModelImage) -> tuple[Any, Any]:
        """`pixel_values` and `image_grid_thw` of `image` from the family's own processor;
        its grid must be the one the prompt was sized by."""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(image.data)) as img:
                rgb = img.convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError):
            raise ModelError("an image's data does not decode as an image") from None
        out = self.spec.processor()(images=[rgb], return_tensors="pt")
        grid = out["image_grid_thw"]
        if tuple(int(x) for x in grid[0]) != tuple(image.grid_thw):
            raise ModelError(
                f"the {rgb.width}x{rgb.height} image has grid "
                f"{tuple(int(x) for x in grid[0])} under {self.spec.name}'s processor, but its "
                f"tokens were sized for {tuple(image.grid_thw)}"
            )
        return out["pixel_values"], grid
