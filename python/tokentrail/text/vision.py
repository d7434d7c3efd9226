"""Images in prompts: what a request's image parts become for a model that takes images.

Translation leaves a mark (`image_mark`) where each image part stood and keeps the part's
source (`ImageSource`). `resolve_images` then, for a family with a vision encoder
(`VisionSpec`), decodes each image under `ImageLimits`, asks the family's own image processor
(from `transformers`, built offline with the family's published parameters; no weights) how
many tokens it takes, and writes the family's placeholder run in its place (Qwen's
`<|vision_start|>` + n x `<|image_pad|>` + `<|vision_end|>`, Kimi K2.5's
`<|media_begin|>image<|media_content|>` + n x `<|media_pad|>` + `<|media_end|>`); for a family
without one, each mark becomes the `[image]` text it always was.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import json
import math
import re
import threading
from abc import ABC, abstractmethod
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import islice
from typing import Any

from tokentrail.errors import ImageError
from tokentrail.kinds import SettingGroup
from tokentrail.messages import Conversation, ImageInput, ImageSource, Message
from tokentrail.setting import setting

__all__ = [
    "IMAGE_PLACEHOLDER",
    "ImageInput",
    "ImageCache",
    "ImageLimits",
    "ImageSource",
    "KimiVision",
    "QwenVision",
    "VisionSpec",
    "image_mark",
    "image_positions",
    "resolve_images",
    "vision_spec",
]

# What an image becomes for a family without a vision encoder (today's behaviour).
IMAGE_PLACEHOLDER = "[image]"

# Private-use code points around an image's digest: a mark no harness text carries.
_OPEN, _CLOSE = "\ue000", "\ue001"
_MARK = re.compile(_OPEN + r"image:([0-9a-f]{64})" + _CLOSE)

# The types the image processor reads (through Pillow).
SUPPORTED_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
_PIL_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"}


def image_mark(digest: str) -> str:
    """The text translation leaves where an image part stood."""
    return f"{_OPEN}image:{digest}{_CLOSE}"


@dataclass(frozen=True)
class ImageLimits:
    """Per image and per request: decoded bytes and pixels (width x height)."""

    max_image_bytes: int = setting(
        20 * 1024 * 1024, SettingGroup.LIMITS, "one image, decoded", unit="bytes"
    )
    max_image_pixels: int = setting(
        64 * 1024 * 1024, SettingGroup.LIMITS, "one image's width x height", unit="pixels"
    )
    max_request_bytes: int = setting(
        64 * 1024 * 1024, SettingGroup.LIMITS,
        "all of a request's images, decoded, each occurrence counted", unit="bytes",
        name="max_request_image_bytes",
    )  # fmt: skip
    max_request_pixels: int = setting(
        256 * 1024 * 1024, SettingGroup.LIMITS,
        "all of a request's images' pixels, each occurrence counted", unit="pixels",
        name="max_request_image_pixels",
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class VisionSpec(ABC):
    """A vision encoder: how its image processor sizes an image (`grid`), how many tokens
    that grid takes, and the placeholder tokens around them."""

    name: str
    patch_size: int
    merge_size: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    start: str
    pad: str
    end: str

    @abstractmethod
    def processor(self) -> Any:
        """The family's image processor from `transformers`, built offline (no weights)."""

    @abstractmethod
    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        """`image_grid_thw` of an image this size: the processor's own resize rule."""

    def tokens(self, grid: tuple[int, int, int]) -> int:
        t, h, w = grid
        return t * h * w // (self.merge_size**2)

    def placeholder(self, tokens: int) -> str:
        return self.start + self.pad * tokens + self.end


@dataclass(frozen=True, kw_only=True)
class QwenVision(VisionSpec):
    """Qwen2-VL's processor (Qwen2.5-VL, Qwen3-VL, Qwen3.5/3.6): `smart_resize` takes both
    sides to multiples of patch x merge with the pixels within [min_pixels, max_pixels]."""

    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    start: str = "<|vision_start|>"
    pad: str = "<|image_pad|>"
    end: str = "<|vision_end|>"

    def processor(self) -> Any:
        """`Qwen2VLImageProcessor` (its torchvision backend) with the family's parameters."""
        return _qwen_processor(self)

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        try:
            h, w = smart_resize(
                height,
                width,
                factor=self.patch_size * self.merge_size,
                min_pixels=self.min_pixels,
                max_pixels=self.max_pixels,
            )
        except ValueError as exc:  # An aspect ratio past 200, which the processor refuses.
            raise ImageError(
                f"the {width}x{height} image does not fit {self.name}: {exc}"
            ) from None
        return 1, h // self.patch_size, w // self.patch_size


def smart_resize(
    height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen2-VL's resize rule, as `transformers`' `smart_resize` states it (the tests hold the
    two together): here so that sizing an image imports neither `transformers` nor `torch`,
    which take seconds and hundreds of MB for a rule of a few lines."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            "absolute aspect ratio must be smaller than 200, got "
            f"{max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True, kw_only=True)
class KimiVision(VisionSpec):
    """Kimi K2.5's MoonViT processor (`Kimi_K25ImageProcessor`): `navit_resize` scales an
    image down (never up) to at most `max_patches` patches and `max_side` patches a side,
    then pads both sides to multiples of patch x merge. Its torchvision backend is needed for
    the pixels only, not for the grid."""

    max_patches: int
    max_side: int
    start: str = "<|media_begin|>image<|media_content|>"
    pad: str = "<|media_pad|>"
    end: str = "<|media_end|>"

    def processor(self) -> Any:
        return _kimi_processor(self)

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        # `navit_resize`, which its module only exports beside a torchvision import.
        patches_h = max(1.0, height // self.patch_size)
        patches_w = max(1.0, width // self.patch_size)
        scale = min(
            1.0,
            math.sqrt(self.max_patches / (patches_h * patches_w)),
            self.max_side * self.patch_size / height,
            self.max_side * self.patch_size / width,
        )
        side = self.max_side * self.patch_size
        new_h = min(max(1, int(height * scale)), side)
        new_w = min(max(1, int(width * scale)), side)
        factor = self.merge_size * self.patch_size
        pad_h = new_h + (factor - new_h % factor) % factor
        pad_w = new_w + (factor - new_w % factor) % factor
        return 1, pad_h // self.patch_size, pad_w // self.patch_size


@cache
def _qwen_processor(spec: QwenVision) -> Any:
    # The torchvision backend, not the Pillow one: it is what `AutoImageProcessor` loads for a
    # checkpoint's `Qwen2VLImageProcessor`, so the pixels an engine (vLLM) computes. The Pillow
    # backend's bicubic resize puts 0.5-0.7% of the pixel values one or two levels of 255 away,
    # which moved the logprobs after an image by up to 1.6e-3 nats from vLLM's
    # (docs/engines/vllm.md). The sizes are the same either way.
    try:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    except ImportError as exc:
        raise ImageError(
            f"{spec.name}'s image processor needs torchvision ({exc}); the token counts do not"
        ) from None
    return Qwen2VLImageProcessor(
        patch_size=spec.patch_size,
        merge_size=spec.merge_size,
        temporal_patch_size=spec.temporal_patch_size,
        size={"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels},
        image_mean=list(spec.image_mean),
        image_std=list(spec.image_std),
    )


@cache
def _kimi_processor(spec: KimiVision) -> Any:
    try:
        from transformers.models.kimi_k25.image_processing_kimi_k25 import (
            Kimi_K25ImageProcessor,
        )
    except ImportError as exc:
        raise ImageError(
            f"{spec.name}'s image processor needs torchvision ({exc}); the token counts do not"
        ) from None
    return Kimi_K25ImageProcessor(
        patch_size=spec.patch_size,
        merge_size=spec.merge_size,
        max_patches=spec.max_patches,
        size={"max_height": spec.max_side, "max_width": spec.max_side},
        image_mean=list(spec.image_mean),
        image_std=list(spec.image_std),
    )


_OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_HALF = (0.5, 0.5, 0.5)
_VISION: dict[str, VisionSpec] = {
    # Qwen2-VL / Qwen2.5-VL: `Qwen2VLImageProcessor`'s defaults.
    "qwen2-vl": QwenVision(
        name="qwen2-vl",
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=56 * 56,
        max_pixels=28 * 28 * 1280,
        image_mean=_OPENAI_CLIP_MEAN,
        image_std=_OPENAI_CLIP_STD,
    ),
    # Qwen3-VL and Qwen3.5/3.6: the same processor with the preprocessor_config.json their
    # checkpoints publish (16-pixel patches, 64K..16M pixels, mean and std 0.5).
    "qwen3-vl": QwenVision(
        name="qwen3-vl",
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=65536,
        max_pixels=16777216,
        image_mean=_HALF,
        image_std=_HALF,
    ),
    # Kimi K2.5/K2.6: `Kimi_K25ImageProcessor`'s defaults (14-pixel patches merged 2x2, at most
    # 16384 patches and 512 a side, mean and std 0.5); an image is the placeholder vLLM and
    # SGLang name for the model, its one `<|media_pad|>` expanded as the processor expands it.
    "kimi-k2.5": KimiVision(
        name="kimi-k2.5",
        patch_size=14,
        merge_size=2,
        max_patches=16384,
        max_side=512,
        image_mean=_HALF,
        image_std=_HALF,
    ),
}


def warm(spec: VisionSpec) -> None:
    """Import what sizing and decoding an image need (the processor's module pulls in
    `transformers`, seconds of imports that hold the interpreter): at startup, not in the
    first request with an image."""
    from PIL import Image

    Image.init()
    spec.grid(448, 448)


def vision_spec(name: str | None) -> VisionSpec | None:
    """The vision encoder a family names (None: the family takes no images)."""
    if name is None:
        return None
    try:
        return _VISION[name]
    except KeyError:
        raise ImageError(f"unknown vision encoder {name!r}; known: {', '.join(_VISION)}") from None


class ImageCache:
    """Images already decoded and sized, by encoder and digest, up to `max_bytes` of what they
    hold (least recently used out first): a harness resends every earlier image each turn,
    and each is decoded once. An image holds its encoded bytes and their base64 text (made
    once, for the engine and the turn's tags), never its decoded pixels."""

    def __init__(self, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._images: OrderedDict[tuple[str, str], ImageInput] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, spec: VisionSpec, digest: str) -> ImageInput | None:
        with self._lock:
            image = self._images.get((spec.name, digest))
            if image is not None:
                self._images.move_to_end((spec.name, digest))
            return image

    def put(self, spec: VisionSpec, image: ImageInput) -> None:
        with self._lock:
            key = (spec.name, image.digest)
            if key in self._images or _held(image) > self.max_bytes:
                return
            self._images[key] = image
            self.bytes += _held(image)
            while self.bytes > self.max_bytes:
                _, dropped = self._images.popitem(last=False)
                self.bytes -= _held(dropped)

    def discard(self, digests: Iterable[str]) -> None:
        """Let these images go (a finished session's): decoded again if sent again."""
        gone = set(digests)
        with self._lock:
            for key in [k for k in self._images if k[1] in gone]:
                self.bytes -= _held(self._images.pop(key))

    def __len__(self) -> int:
        return len(self._images)


def _held(image: ImageInput) -> int:
    """The memory a cached image holds: its bytes and their base64 text."""
    return len(image.data) + 4 * ((len(image.data) + 2) // 3)


@dataclass
class _Budget:
    limits: ImageLimits
    cache: ImageCache | None
    bytes: int = 0
    pixels: int = 0

    def take(self, image: ImageInput) -> ImageInput:
        """Count `image` against the request's limits (every occurrence counts)."""
        self.bytes += len(image.data)
        self.pixels += image.width * image.height
        if self.bytes > self.limits.max_request_bytes:
            raise ImageError(f"the request's images are over {self.limits.max_request_bytes} bytes")
        if self.pixels > self.limits.max_request_pixels:
            raise ImageError(
                f"the request's images are over {self.limits.max_request_pixels} pixels"
            )
        return image


def resolve_images(
    conversation: Conversation,
    spec: VisionSpec | None,
    limits: ImageLimits | None = None,
    cache: ImageCache | None = None,
    plain: int = 0,
) -> Conversation:
    """The conversation with every image mark replaced: by the family's placeholder run (the
    image decoded, checked and sized; its digest listed in the message's `images`, in order)
    or, without a vision encoder, by `[image]` as before. Messages without marks are the
    very same objects. `cache` keeps decoded images between requests. Raises `ImageError`
    for an image the model cannot take. The first `plain` messages are known to hold no
    marks and no `images` (the caller looked at these very objects before): when the rest
    hold none either, nothing is looked at twice."""
    if not any(
        _MARK.search(m.get("content") or "") or m.get("images")
        for m in islice(conversation.messages, plain, None)
    ):
        return conversation
    budget = _Budget(limits or ImageLimits(), cache)
    messages: list[Message] = []
    images: list[ImageInput] = []
    first_changed: int | None = None
    for pos, message in enumerate(conversation.messages):
        content = message.get("content") or ""
        if not _MARK.search(content):
            # A message taken from the tree (a Responses `previous_response_id`) already holds
            # its images' tokens: its images come from the cache.
            for digest in message.get("images") or ():
                if spec is None:
                    break
                held = cache.get(spec, digest) if cache is not None else None
                if held is None:
                    raise ImageError(
                        f"messages[{pos}]: an earlier turn's image is no longer held; send the "
                        "whole conversation instead of previous_response_id"
                    )
                images.append(budget.take(held))
            messages.append(message)
            continue
        first_changed = pos if first_changed is None else first_changed
        if spec is None:
            messages.append({**message, "content": _MARK.sub(IMAGE_PLACEHOLDER, content)})
            continue
        here: list[ImageInput] = []

        def place(match: re.Match[str], here: list[ImageInput] = here, pos: int = pos) -> str:
            source = conversation.image_sources.get(match.group(1))
            if source is None:
                raise ImageError(f"messages[{pos}]: an image mark without its image")
            image = _decoded(source, spec, budget, f"messages[{pos}]")
            here.append(image)
            return spec.placeholder(image.tokens)

        text = _MARK.sub(place, content)
        messages.append({**message, "content": text, "images": [i.digest for i in here]})
        images.extend(here)
    dropped = Counter(conversation.dropped_media)
    if images:
        dropped["image"] -= len(images)
    unchanged = min(conversation.unchanged, first_changed or 0)
    return dataclasses.replace(
        conversation,
        messages=messages,
        dropped_media={k: n for k, n in dropped.items() if n > 0},
        unchanged=unchanged,
        images=images,
    )


def _decoded(source: ImageSource, spec: VisionSpec, budget: _Budget, where: str) -> ImageInput:
    if source.url is not None:
        raise ImageError(
            f"{where}: image URLs are not fetched; send the image as base64 data "
            f"(got {source.url[:80]!r})"
        )
    limits = budget.limits
    declared = (source.media_type or "").lower()
    if declared not in SUPPORTED_TYPES:
        raise ImageError(
            f"{where}: unsupported image type {source.media_type!r}; "
            f"supported: {', '.join(SUPPORTED_TYPES)}"
        )
    # Checked as for a first sight, whatever the cache holds: a request is answered the same
    # whether or not another session sent the same bytes before.
    known = budget.cache.get(spec, source.digest) if budget.cache is not None else None
    if known is not None:
        if len(known.data) > limits.max_image_bytes:
            raise ImageError(f"{where}: the image is over {limits.max_image_bytes} bytes")
        if known.width * known.height > limits.max_image_pixels:
            raise ImageError(
                f"{where}: the image is {known.width}x{known.height}, over "
                f"{limits.max_image_pixels} pixels"
            )
        _check_declared(known.media_type, declared, where)
        return budget.take(known)
    assert source.data is not None
    if len(source.data) > (limits.max_image_bytes * 4) // 3 + 4:
        raise ImageError(f"{where}: the image is over {limits.max_image_bytes} bytes")
    try:
        data = b64decode_in_pieces(source.data)
    except (binascii.Error, ValueError):
        raise ImageError(f"{where}: the image data is not valid base64") from None
    if len(data) > limits.max_image_bytes:
        raise ImageError(f"{where}: the image is over {limits.max_image_bytes} bytes")
    width, height, found = _probe(data, limits.max_image_pixels, where)
    _check_declared(found, declared, where)
    grid = spec.grid(height, width)
    image = ImageInput(source.digest, found, data, width, height, grid, spec.tokens(grid))
    if budget.cache is not None:
        budget.cache.put(spec, image)
    return budget.take(image)


# Base64 decoded this many characters at a time (a multiple of 4): one call over a 27 MB
# image holds the interpreter, and the event loop waiting for it, for a fifth of a second.
_B64_PIECE = 1 << 18


def b64decode_in_pieces(text: str) -> bytes:
    """`base64.b64decode(text, validate=True)`, a piece at a time, so other threads run between
    pieces; padding is taken only at the very end, as the whole decode takes it."""
    if len(text) <= _B64_PIECE:
        return base64.b64decode(text, validate=True)
    out = []
    last = (len(text) - 1) // _B64_PIECE * _B64_PIECE
    for start in range(0, len(text), _B64_PIECE):
        piece = text[start : start + _B64_PIECE]
        if start < last and "=" in piece:
            raise binascii.Error("padding before the end of the data")
        out.append(base64.b64decode(piece, validate=True))
    # `bytes.join` lets go of the interpreter while it copies; `bytes(bytearray)` does not.
    return b"".join(out)


def _check_declared(found: str, declared: str, where: str) -> None:
    if found != declared and not (found == "image/jpeg" and declared == "image/jpg"):
        raise ImageError(f"{where}: the image is declared {declared} but its data is {found}")


def _probe(data: bytes, max_pixels: int, where: str) -> tuple[int, int, str]:
    """Width, height and type of encoded image bytes, decoded in full (a truncated file
    fails) once the header's size is within `max_pixels`."""
    from PIL import Image, UnidentifiedImageError

    too_big = False
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt = img.format or ""
            width, height = img.size
            too_big = width * height > max_pixels
            if not too_big:
                img.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        raise ImageError(f"{where}: the image data does not decode as an image") from None
    if too_big:
        raise ImageError(f"{where}: the image is {width}x{height}, over {max_pixels} pixels")
    if fmt not in _PIL_FORMATS:
        raise ImageError(f"{where}: unsupported image format {fmt or 'unknown'}")
    return width, height, _PIL_FORMATS[fmt]


def image_positions(ids: Sequence[int], pad_id: int) -> list[tuple[int, int]]:
    """(start, length) of each run of `pad_id` in `ids`: where each image's tokens are."""
    runs: list[tuple[int, int]] = []
    start = None
    for pos, tok in enumerate(ids):
        if int(tok) == pad_id:
            if start is None:
                start = pos
        elif start is not None:
            runs.append((start, pos - start))
            start = None
    if start is not None:
        runs.append((start, len(ids) - start))
    return runs


def image_source(block: Mapping[str, Any]) -> ImageSource:
    """Where an image part's pixels are, in any protocol's shape: Anthropic's `source`
    (`base64` or `url`), OpenAI's `image_url` (an object or, in Responses, a string; a `data:`
    URL is base64). A part without either (a `file_id`) has a source with neither."""
    source = block.get("source")
    if isinstance(source, dict):
        if source.get("type") == "base64" and isinstance(source.get("data"), str):
            media_type = source.get("media_type")
            return ImageSource.of_base64(
                source["data"], media_type.lower() if isinstance(media_type, str) else None
            )
        if source.get("type") == "url" and isinstance(source.get("url"), str):
            return ImageSource.of_url(source["url"])
    url = block.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    if isinstance(url, str):
        return ImageSource.of_url(url)
    return ImageSource.unreadable(json.dumps(block, sort_keys=True, default=str))
