"""What a harness reads when vLLM refuses or fails a turn, through the real adapter and the
official SDKs, against the stand-in `FakeVLLM` (held to real vLLM 0.32 by
`tests/real_engines/test_vllm_dense.py`): the served context (`max_model_len`, not the model
config's) bounds prompts before any engine call; a prompt or parameter vLLM refuses (its 400)
is the protocol's 400 with vLLM's message, which SDKs do not retry; any other engine status is
a 502 that names it and carries the engine's message; the image routes' 403 (a vLLM started
without `--enable-scale-out`) says so."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import anthropic
import openai
import pytest

from support.fake_engines import FakeVLLM
from support.images import image_block, png
from tokentrail.adapter import Adapter, start_server
from tokentrail.adapter.config import AdapterConfig
from tokentrail.adapter.request.limits import Limits
from tokentrail.engines.vllm import VLLMEngine
from tokentrail.text.tokenizer import load_tokenizer

SERVED = 300


@functools.cache
def _tokenizer(spec: str) -> Any:
    return load_tokenizer(spec)


def asked(fake: FakeVLLM, call: Any, *, vocabulary: str = "builtin:qwen3", **config: Any) -> Any:
    """`call(url)` against an adapter over `fake`: what it returned or raised."""

    async def go() -> Any:
        tokenizer = _tokenizer(vocabulary)
        async with fake as srv:
            engine = VLLMEngine(srv.url, tokenizer, model="m")
            adapter = Adapter(engine=engine, tokenizer=tokenizer, config=AdapterConfig(**config))
            runner, url = await start_server(adapter)
            try:
                return await call(url)
            except (anthropic.APIStatusError, openai.APIStatusError) as exc:
                return exc
            finally:
                await runner.cleanup()
                await engine.close()

    return asyncio.run(go())


def words(n: int) -> str:
    return " ".join(["word"] * n)


def anthropic_turn(text: str, max_tokens: int = 8) -> Any:
    async def call(url: str) -> Any:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
        messages = [{"role": "user", "content": text}]
        return await client.messages.create(model="m", max_tokens=max_tokens, messages=messages)

    return call


def chat_turn(text: str, **extra: Any) -> Any:
    async def call(url: str) -> Any:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="s", max_retries=0)
        messages = [{"role": "user", "content": text}]
        return await client.chat.completions.create(
            model="m", max_tokens=8, messages=messages, **extra
        )

    return call


def test_the_served_context_bounds_a_prompt_before_vllm_is_asked() -> None:
    fake = FakeVLLM(max_model_len=SERVED)
    refused = asked(fake, anthropic_turn(words(400)))
    assert isinstance(refused, anthropic.BadRequestError), refused
    assert refused.body["error"]["type"] == "invalid_request_error"
    assert "prompt is too long" in str(refused) and f"> {SERVED} maximum" in str(refused)
    assert fake.bodies("/v1/completions") == []


def test_an_answer_fits_what_the_served_context_leaves() -> None:
    fake = FakeVLLM(max_model_len=SERVED)
    reply = asked(fake, anthropic_turn(words(250), max_tokens=4000))
    assert not isinstance(reply, Exception), reply
    (body,) = fake.bodies("/v1/completions")
    assert len(body["prompt"]) + body["max_tokens"] == SERVED


@pytest.mark.parametrize("sdk", ["anthropic", "openai"])
def test_a_prompt_vllm_refuses_is_the_protocols_400(sdk: str) -> None:
    # tokentrail's own bound let through (`max_prompt_tokens`): vLLM judges the prompt.
    fake = FakeVLLM(max_model_len=SERVED)
    turn = anthropic_turn if sdk == "anthropic" else chat_turn
    refused = asked(fake, turn(words(400)), limits=Limits(max_prompt_tokens=10**6))
    error = anthropic.BadRequestError if sdk == "anthropic" else openai.BadRequestError
    assert isinstance(refused, error), refused
    assert refused.status_code == 400
    assert f"maximum context length is {SERVED} tokens" in str(refused)
    assert "(HTTP 400)" in str(refused)


def test_a_parameter_vllm_refuses_is_a_400() -> None:
    fake = FakeVLLM(fail_status=422, fail_message="top_k: Input should be an integer")
    fake.mode = "fail"
    refused = asked(fake, chat_turn("hi"))
    assert isinstance(refused, openai.BadRequestError), refused
    assert "top_k: Input should be an integer" in str(refused) and "(HTTP 422)" in str(refused)


@pytest.mark.parametrize("status", [500, 503, 404])
def test_any_other_engine_status_is_a_502_that_names_it(status: int) -> None:
    fake = FakeVLLM(fail_status=status, fail_message="KV cache exhausted (fake)")
    fake.mode = "fail"
    failed = asked(fake, anthropic_turn("hi"))
    assert isinstance(failed, anthropic.APIStatusError) and failed.status_code == 502, failed
    assert failed.body["error"]["type"] == "api_error"
    assert "KV cache exhausted (fake)" in str(failed) and f"(HTTP {status})" in str(failed)


def test_the_image_routes_403_names_the_flag_vllm_needs() -> None:
    fake = FakeVLLM(scale_out=False)

    async def call(url: str) -> Any:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
        content = [image_block(png(40, 30)), {"type": "text", "text": "what is it?"}]
        messages = [{"role": "user", "content": content}]
        return await client.messages.create(model="m", max_tokens=8, messages=messages)

    failed = asked(fake, call, vocabulary="builtin:qwen3-vl")
    assert isinstance(failed, anthropic.APIStatusError) and failed.status_code == 502, failed
    assert "--enable-scale-out" in str(failed) and "(HTTP 403)" in str(failed)
