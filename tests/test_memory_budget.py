"""The memory budget (`--max-memory`): a request the budget has no room for is refused before
its body is read, in its protocol's own shape (Anthropic's 529 `overloaded_error`, OpenAI's
429 `rate_limit_error`) with `Retry-After`; a new session is refused before the open ones are,
and an open session's small turn goes on. The resident set the budget reads is set by the test
(it is the process's own otherwise), so the numbers are exact."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import anthropic
import openai

from support.images import image_block, png
from tokentrail import cli
from tokentrail.adapter import start_server
from tokentrail.adapter.http.memory import MemoryBudget, default_max_memory, machine_memory, rss
from tokentrail.cli import settings
from tokentrail.cli.serve import ServeSettings, build_adapter

MB = 1024 * 1024


def adapter_for(argv: list[str]) -> Any:
    args = cli.build_parser().parse_args(
        ["serve", "--tokenizer", "builtin:qwen3-vl", "--engine", "scripted", *argv]
    )
    r = settings.resolve(ServeSettings, args, {})
    return build_adapter(r.build(ServeSettings))


def test_the_setting_reaches_the_adapter_and_defaults_to_half_the_machine() -> None:
    assert adapter_for(["--max-memory", str(3 * 1024 * MB)]).memory.max_bytes == 3 * 1024 * MB
    assert adapter_for([]).memory.max_bytes == default_max_memory()
    assert default_max_memory() == machine_memory() // 2
    assert 0 < rss() < machine_memory()


def test_requests_past_the_budget_are_refused_in_their_protocols_shape() -> None:
    adapter = adapter_for([])
    held = [900 * MB]
    adapter.memory = MemoryBudget(1100 * MB, resident=lambda: held[0])
    # A 20 MB image: its body is 27 MB of base64, and a request holds it 4 times over.
    big = image_block(png(2600, 2600, seed=3))
    text = [{"role": "user", "content": "hello"}]

    async def go() -> dict[str, Any]:
        runner, url = await start_server(adapter)

        def ant_as(sid: str) -> Any:
            return anthropic.AsyncAnthropic(base_url=url, api_key=sid, max_retries=0).messages

        oai = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="c", max_retries=0)
        out: dict[str, Any] = {}

        async def ask(name: str, call: Any) -> None:
            try:
                out[name] = await call
            except (anthropic.APIStatusError, openai.APIStatusError) as exc:
                out[name] = exc

        try:
            await ask("open a", ant_as("a").create(model="m", max_tokens=8, messages=text))
            held[0] = 1000 * MB  # past the share new sessions may take (990 MB), under 1100
            await ask("new b", ant_as("b").create(model="m", max_tokens=8, messages=text))
            await ask(
                "new c",
                oai.chat.completions.create(model="m", max_tokens=8, messages=text),  # type: ignore[arg-type]
            )
            image = [{"role": "user", "content": [{"type": "text", "text": "see"}, big]}]
            await ask("a image", ant_as("a").create(model="m", max_tokens=8, messages=image))
            again = [
                *text,
                {"role": "assistant", "content": "hi"},
                {"role": "user", "content": "go"},
            ]
            await ask("a text", ant_as("a").create(model="m", max_tokens=8, messages=again))
            held[0] = 500 * MB  # memory given back: the same requests pass
            await ask("new b later", ant_as("b").create(model="m", max_tokens=8, messages=text))
        finally:
            await runner.cleanup()
        return out

    out = asyncio.run(go())
    assert isinstance(out["open a"], anthropic.types.Message)
    for name in ("new b", "a image"):
        refused = out[name]
        assert isinstance(refused, anthropic.APIStatusError), (name, refused)
        assert refused.status_code == 529
        assert refused.body["type"] == "error"
        assert refused.body["error"]["type"] == "overloaded_error"
        assert "--max-memory" in refused.body["error"]["message"]
        assert refused.response.headers["retry-after"] == "5"
    assert "new session" in out["new b"].body["error"]["message"]
    refused = out["new c"]
    assert isinstance(refused, openai.RateLimitError), refused
    assert refused.status_code == 429
    assert refused.body["type"] == "rate_limit_error"  # type: ignore[index]
    assert refused.response.headers["retry-after"] == "5"
    # The open session's small turn goes on; nothing of the refused ones was recorded.
    assert isinstance(out["a text"], anthropic.types.Message)
    assert isinstance(out["new b later"], anthropic.types.Message)
    assert adapter.manager.turn_count("a") == 2
    assert not adapter.manager.has_session("c")


def test_sizing_an_image_imports_neither_transformers_nor_torch() -> None:
    # They cost seconds and hundreds of MB of resident memory for a resize rule.
    code = (
        "import sys\n"
        "from tokentrail.text.vision import vision_spec\n"
        "spec = vision_spec('qwen3-vl')\n"
        "assert spec.grid(2600, 2600) == (1, 162, 162), spec.grid(2600, 2600)\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_kept_finish_holds_its_images_in_a_file_and_a_repeat_answers_them_again() -> None:
    adapter = adapter_for(["--admin-token", "t"])
    shot = png(300, 200, seed=5)

    async def go() -> tuple[Any, Any, Any]:
        runner, url = await start_server(adapter)
        try:
            client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
            content = [{"type": "text", "text": "see"}, image_block(shot)]
            await client.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": content}]
            )
            first = await adapter.finish_trajectory("s", reward=1.0)
            (tomb_result,) = [
                t.result
                for t in adapter.sessions._closed._kept  # noqa: SLF001 - what is kept
            ]
            again = await adapter.finish_trajectory("s", reward=1.0)
            return first, tomb_result, again
        finally:
            await runner.cleanup()

    first, kept, again = asyncio.run(go())
    spilled = adapter.sessions._closed.images  # noqa: SLF001
    (image,) = first.samples[0].metadata["images"]
    assert first.samples[0].multimodal_inputs()["images"] == [shot]
    # Kept without the bytes (they are in the file), answered again with them.
    assert "data" not in kept.samples[0].metadata["images"][0]
    assert len(spilled) == 1
    assert again.samples[0].metadata == first.samples[0].metadata
    assert again.samples[0].multimodal_inputs()["images"] == [shot]
    # Past the retention window the file is let go.
    assert adapter.sessions._closed.expire(float("inf")) == 1  # noqa: SLF001
    assert len(spilled) == 0
