"""The image limits as `tokentrail serve` settings: each of `--max-image-bytes`,
`--max-image-pixels`, `--max-request-image-bytes` and `--max-request-image-pixels` (and its
`TOKENTRAIL_*` variable and `--config` key) reaches the adapter built from them, a request past
the configured limit gets a 400 in its protocol's shape and one at it is served, and
`--print-config` prints them back as a file that gives the same limits."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anthropic
import pytest

from support.images import image_block, png
from tokentrail import cli
from tokentrail.adapter import start_server
from tokentrail.cli import settings
from tokentrail.cli.serve import ServeSettings, build_adapter
from tokentrail.text.vision import ImageLimits

SID = {"X-Session-Id": "s"}


def resolved(argv: list[str], environ: dict[str, str] | None = None) -> settings.Resolved:
    args = cli.build_parser().parse_args(["serve", *argv])
    return settings.resolve(ServeSettings, args, environ or {})


def serve_one(argv: list[str], images: list[bytes]) -> Any:
    """One Anthropic request with `images` to the adapter `serve argv` builds (Qwen3-VL, the
    scripted engine): the reply, or the error the SDK raised."""
    r = resolved(["--tokenizer", "builtin:qwen3-vl", "--engine", "scripted", *argv])
    adapter = build_adapter(r.build(ServeSettings))

    async def go() -> Any:
        runner, url = await start_server(adapter)
        client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
        blocks = [{"type": "text", "text": "look"}, *map(image_block, images)]
        try:
            return await client.messages.create(
                model="m",
                max_tokens=8,
                messages=[{"role": "user", "content": blocks}],
                extra_headers=SID,
            )
        except anthropic.APIStatusError as exc:
            return exc
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def refused_with(out: Any, says: str) -> None:
    assert isinstance(out, anthropic.BadRequestError), out
    assert out.status_code == 400
    assert out.body["type"] == "error"
    assert out.body["error"]["type"] == "invalid_request_error"
    assert says in out.body["error"]["message"]


def served(out: Any) -> None:
    assert isinstance(out, anthropic.types.Message), out
    assert out.content


def test_the_settings_reach_the_adapters_image_limits() -> None:
    r = resolved(
        ["--max-image-bytes", "1000", "--max-request-image-pixels", "5000"],
        {"TOKENTRAIL_MAX_IMAGE_PIXELS": "2000", "TOKENTRAIL_MAX_REQUEST_IMAGE_BYTES": "3000"},
    )
    assert r.build(ServeSettings).config.image_limits == ImageLimits(1000, 2000, 3000, 5000)
    # Left out, each is ImageLimits' own default.
    assert resolved([]).build(ServeSettings).config.image_limits == ImageLimits()


def test_a_request_over_a_configured_image_limit_is_a_400_and_one_at_it_is_served() -> None:
    one, two = png(100, 100, seed=1), png(100, 100, seed=2)
    per_image = len(one)
    refused_with(serve_one(["--max-image-pixels", "9999"], [one]), "over 9999 pixels")
    served(serve_one(["--max-image-pixels", "10000"], [one]))
    bytes_over = str(per_image - 1)
    refused_with(serve_one(["--max-image-bytes", bytes_over], [one]), f"over {bytes_over} bytes")
    served(serve_one(["--max-image-bytes", str(per_image)], [one]))
    # Per request: two images of 10000 pixels each, and the same image twice counts twice.
    refused_with(
        serve_one(["--max-request-image-pixels", "19999"], [one, two]),
        "request's images are over 19999 pixels",
    )
    refused_with(
        serve_one(["--max-request-image-pixels", "19999"], [one, one]),
        "request's images are over 19999 pixels",
    )
    served(serve_one(["--max-request-image-pixels", "20000"], [one, two]))
    pair = len(one) + len(two)
    refused_with(
        serve_one(["--max-request-image-bytes", str(pair - 1)], [one, two]),
        f"request's images are over {pair - 1} bytes",
    )
    served(serve_one(["--max-request-image-bytes", str(pair)], [one, two]))


def test_print_config_round_trips_the_image_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for f in settings.fields_of(ServeSettings):
        monkeypatch.delenv(f.env, raising=False)
    monkeypatch.setenv("TOKENTRAIL_MAX_REQUEST_IMAGE_PIXELS", "4000")
    argv = ["--max-image-bytes", "1000", "--max-image-pixels", "2000"]
    config = tmp_path / "serve.toml"
    config.write_text("[limits]\nmax-request-image-bytes = 3000\n")
    assert cli.main(["serve", *argv, "--config", str(config), "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "max-image-bytes = 1000  # command line" in printed
    assert "max-request-image-bytes = 3000  # config file" in printed
    assert "max-request-image-pixels = 4000  # environment" in printed
    monkeypatch.delenv("TOKENTRAIL_MAX_REQUEST_IMAGE_PIXELS")
    saved = tmp_path / "printed.toml"
    saved.write_text(printed)
    again = resolved(["--config", str(saved)])
    assert again.build(ServeSettings).config.image_limits == ImageLimits(1000, 2000, 3000, 4000)


def test_a_cached_image_is_checked_against_each_requests_declared_type() -> None:
    """Session A sends a PNG as `image/png`; session B's identical bytes declared `image/gif`,
    `image/x-evil` or with no type get the 400 they get when A never sent them: the shared
    cache decides nothing about B's request, and tells B nothing about A's."""
    r = resolved(["--tokenizer", "builtin:qwen3-vl", "--engine", "scripted"])
    adapter = build_adapter(r.build(ServeSettings))
    data = png(64, 64, seed=7)

    async def ask(client: anthropic.AsyncAnthropic, sid: str, media_type: str | None) -> Any:
        block = image_block(data)
        if media_type is None:
            del block["source"]["media_type"]
        else:
            block["source"]["media_type"] = media_type
        try:
            return await client.messages.create(
                model="m",
                max_tokens=8,
                messages=[{"role": "user", "content": [{"type": "text", "text": "?"}, block]}],
                extra_headers={"X-Session-Id": sid},
            )
        except anthropic.APIStatusError as exc:
            return exc

    async def go() -> tuple[list[Any], Any, list[Any]]:
        runner, url = await start_server(adapter)
        client = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)
        wrong = ["image/gif", "image/x-evil", None]
        try:
            before = [await ask(client, f"b{i}", t) for i, t in enumerate(wrong)]
            first = await ask(client, "a", "image/png")
            after = [await ask(client, f"c{i}", t) for i, t in enumerate(wrong)]
            return before, first, after
        finally:
            await runner.cleanup()

    before, first, after = asyncio.run(go())
    served(first)
    assert len(adapter.requests.image_cache) == 1
    for cold, warm in zip(before, after, strict=True):
        assert isinstance(cold, anthropic.BadRequestError), cold
        assert isinstance(warm, anthropic.BadRequestError), warm
        assert warm.body == cold.body


def png_of_size(size: int) -> bytes:
    """A PNG of exactly `size` bytes: a small image with a private ancillary chunk (which
    every decoder skips) filling the rest."""
    import struct
    import zlib

    small = png(32, 32, seed=3)
    end = small.rindex(b"IEND") - 4
    fill = size - len(small) - 12
    chunk = b"prVt" + b"\0" * fill
    padded = struct.pack(">I", fill) + chunk + struct.pack(">I", zlib.crc32(chunk))
    out = small[:end] + padded + small[end:]
    assert len(out) == size
    return out


def test_an_image_at_the_default_image_limit_fits_the_default_body_limit() -> None:
    """The default `--max-image-bytes` is reachable: an image of exactly that many bytes, as
    base64 in a request, is within the default `--max-body-bytes` and served."""
    limit = ImageLimits().max_image_bytes
    served(serve_one([], [png_of_size(limit)]))
    refused_with(serve_one([], [png_of_size(limit + 1)]), f"over {limit} bytes")
