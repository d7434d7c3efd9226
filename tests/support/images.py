"""Images for the image tests: noise PNGs (as large as their pixels, a screenshot's worst case)
and the Anthropic `image` block that carries one."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
from PIL import Image


def png(width: int, height: int, seed: int = 0, fmt: str = "PNG") -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


def image_block(data: bytes, media_type: str = "image/png") -> dict[str, Any]:
    source = {"type": "base64", "media_type": media_type, "data": base64.b64encode(data).decode()}
    return {"type": "image", "source": source}
