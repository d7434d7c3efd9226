"""What an operator sees of the served adapter: every 5xx logged once at WARNING with its
reason, session and engine request id; `--access-log` lines (text or JSON); an engine that is
down answered at once with the protocol's error naming its URL; `serve --help` listing the
logging flags.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from support.fake_engines import FakeSGLang
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.adapter.http.access_log import AccessLog
from tokentrail.engines.sglang import SGLangEngine
from tokentrail.engines.vllm import VLLMEngine
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer

HI = {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def tokenizer() -> LoadedTokenizer:
    return load_tokenizer("builtin:qwen3")


def qwen_reply(tokenizer: LoadedTokenizer) -> Any:
    ids = [*tokenizer.encode("Hello there."), tokenizer.token_id("<|im_end|>")]
    return lambda _ids: (ids, [-0.25] * len(ids), "stop")


def warnings_of(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("as_json", [True, False])
def test_access_log_has_one_line_per_request(tokenizer, tmp_path: Path, as_json: bool) -> None:
    path = tmp_path / "access.log"

    async def go() -> None:
        async with FakeSGLang(qwen_reply(tokenizer)) as fake:
            config = AdapterConfig(access_log=AccessLog(str(path), json=as_json))
            adapter = Adapter(
                engine=SGLangEngine(fake.url, tokenizer), tokenizer=tokenizer, config=config
            )
            runner, url = await start_server(adapter)
            try:
                client = anthropic.AsyncAnthropic(base_url=url, api_key="ops-1", max_retries=0)
                await client.messages.create(**HI)
                async with aiohttp.ClientSession() as http:
                    async with http.get(f"{url}/nowhere") as resp:
                        assert resp.status == 404
                fake.mode = "fail"
                other = [{"role": "user", "content": "something else"}]
                with pytest.raises(anthropic.APIStatusError):
                    await client.messages.create(**{**HI, "messages": other})
            finally:
                await runner.cleanup()

    asyncio.run(go())
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    if as_json:
        ok, missing, failed = (json.loads(line) for line in lines)
        assert ok["method"] == "POST" and ok["route"] == "/v1/messages"
        assert (ok["status"], ok["session"]) == (200, "ops-1")
        assert ok["prompt_tokens"] > 0 and ok["output_tokens"] == 4
        assert ok["duration_ms"] >= 0
        assert (missing["status"], missing["session"]) == (404, None)
        assert (failed["status"], failed["session"], failed["output_tokens"]) == (
            502,
            "ops-1",
            None,
        )
    else:
        assert lines[0].startswith("method=POST route=/v1/messages status=200 session=ops-1 ")
        assert "output_tokens=4" in lines[0]
        assert " status=404 session=- " in lines[1]
        assert " status=502 session=ops-1 " in lines[2]


def test_every_5xx_is_logged_once_with_reason_session_and_request_id(tokenizer, caplog) -> None:
    async def go() -> tuple[FakeSGLang, int]:
        async with FakeSGLang(qwen_reply(tokenizer), mode="fail") as fake:
            adapter = Adapter(engine=SGLangEngine(fake.url, tokenizer), tokenizer=tokenizer)
            runner, url = await start_server(adapter)
            try:
                client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="ops-2", max_retries=0)
                with pytest.raises(openai.APIStatusError) as info:
                    await client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "hi"}]
                    )
            finally:
                await runner.cleanup()
            return fake, info.value.status_code

    with caplog.at_level(logging.WARNING):
        fake, status = asyncio.run(go())
    assert status == 502
    rid = fake.bodies("/generate")[0]["rid"]
    logged = [m for m in warnings_of(caplog) if "answered 502" in m]
    assert logged == [
        f"POST /v1/chat/completions answered 502: engine error: sglang at {fake.url}/generate: "
        f"CUDA out of memory (fake) (HTTP 500) (session ops-2, request {rid})"
    ]


def test_an_engine_that_is_down_is_answered_at_once_naming_its_url(tokenizer, caplog) -> None:
    async def go() -> anthropic.APIStatusError:
        # Nothing listens on port 9 (discard): the connection is refused.
        engine = VLLMEngine("http://127.0.0.1:9", tokenizer, model="m")
        adapter = Adapter(engine=engine, tokenizer=tokenizer)
        runner, url = await start_server(adapter)
        try:
            # A hang would end in the SDK's timeout, not in an answer.
            client = anthropic.AsyncAnthropic(
                base_url=url, api_key="ops-3", max_retries=0, timeout=30
            )
            with pytest.raises(anthropic.APIStatusError) as info:
                await client.messages.create(**HI)
            return info.value
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.WARNING):
        error = asyncio.run(go())
    assert error.status_code == 502
    assert error.body["error"]["type"] == "api_error"
    message = error.body["error"]["message"]
    assert "cannot reach vllm at http://127.0.0.1:9/" in message  # /weight_info, asked first
    assert [m for m in warnings_of(caplog) if "answered 502" in m and "ops-3" in m]


def test_serve_help_lists_the_logging_flags() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tokentrail", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for flag in ("--log-level", "--access-log", "--access-log-json"):
        assert flag in out
