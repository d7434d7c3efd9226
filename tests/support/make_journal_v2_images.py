"""Writes `journal_v2_images.db` and its `.expected.json`: a schema-2 journal whose turns' tags
carry their images' bytes, as the releases before schema 3 wrote them.

    PYTHONPATH=<a schema-2 tokentrail>/python python tests/support/make_journal_v2_images.py OUT

Run against a schema-2 release (the checked-in files were made at commit 428490f). Two
sessions through the real adapter, Anthropic SDK and Qwen3-VL vocabulary: `job-0` (three
turns, an image at turns 1 and 2, every later prompt resending them) finished, with the
samples that release answered in the `.expected.json`; `job-1` (two turns, the same first
image) left unfinished.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import sys
from pathlib import Path
from typing import Any

import anthropic
import numpy as np
from PIL import Image

from tokentrail.adapter import Adapter, start_server
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.storage.journal import Journal
from tokentrail.text.tokenizer import load_tokenizer


def png(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def image_block(data: bytes) -> dict[str, Any]:
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()}
    return {"type": "image", "source": source}


async def session(url: str, sid: str, images: list[bytes | None]) -> None:
    client = anthropic.AsyncAnthropic(base_url=url, api_key=sid, max_retries=0)
    messages: list[dict[str, Any]] = []
    for k, image in enumerate(images):
        content: list[dict[str, Any]] = [{"type": "text", "text": f"{sid} step {k}"}]
        if image is not None:
            content.append(image_block(image))
        messages.append({"role": "user", "content": content})
        reply = await client.messages.create(
            model="m", max_tokens=16, messages=messages, extra_headers={"X-Session-Id": sid}
        )
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})


async def main(out: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-receipts", "-lock"):
        Path(f"{out}{suffix}").unlink(missing_ok=True)
    tokenizer = load_tokenizer("builtin:qwen3-vl")
    first, second = png(64, 48, seed=1), png(40, 40, seed=2)
    script = [[{"type": "text", "text": f"seen {k}"}] for k in range(5)]
    journal = Journal(out)
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer, script), tokenizer=tokenizer, journal=journal
    )
    runner, url = await start_server(adapter)
    try:
        await session(url, "job-0", [first, second, None])
        await session(url, "job-1", [first, None])
        trajectory = await adapter.finish_trajectory("job-0", reward=1.0)
    finally:
        await runner.cleanup()
        journal.close()
    expected = {"job-0": {"samples": [s.to_dict() for s in trajectory.samples]}}
    Path(f"{out.with_suffix('')}.expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
