"""A real vLLM (CPU build) serving the tiny Qwen3 behind `tokentrail serve --engine vllm://`:
the official SDKs on the three protocols, streamed and not, with engine streaming on and off,
record exactly the logprobs vLLM answered and pass the recompute audit, and so does a real
Codex session; the served context
(`--max-model-len`, not config.json) bounds prompts, and vLLM's own refusal of one over it is
the protocol's 400; a client that goes away stops vLLM's request; every sample's weight
versions are filled, and follow `/update_weight_version`. The stand-in `FakeVLLM` is held to
the real server: the same requests, the same answers' fields, modulo what was sampled.

Every engine call goes through a recording proxy (`support.vllm_server.recording`), so a test
reads exactly what vLLM answered tokentrail.
"""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from support.codex import install_codex, run_codex, write_home
from support.fake_engines import FakeVLLM
from support.real_sessions import (
    PROTOCOLS,
    assert_recorded_as_answered,
    finished_samples,
    require_npm,
    run_session,
)
from support.serve import Served, serving
from support.vllm_server import (
    MAX_MODEL_LEN,
    Recording,
    VLLMServer,
    fields,
    read,
    recording,
    until,
)
from tokentrail.model.forward import CausalLM

MODEL = "qwen3"


@pytest.fixture(scope="module")
def vllm(vllm_servers) -> VLLMServer:
    return vllm_servers.get(MODEL)


@pytest.fixture(scope="module")
def proxy(vllm: VLLMServer) -> Iterator[Recording]:
    with recording(vllm.url) as rec:
        yield rec


def engine_spec(rec: Recording) -> str:
    return "vllm://" + rec.url.removeprefix("http://")


@pytest.fixture(scope="module")
def adapters(vllm: VLLMServer, proxy: Recording) -> Iterator[dict[bool, Served]]:
    """`tokentrail serve` over the proxy, by engine streaming on (True) and off (False). The
    one without lets any prompt through (`--max-prompt-tokens`), so that vLLM judges it."""
    model = str(vllm.model_dir)
    with (
        serving(Path(), "--tokenizer", model, "--engine-stream", engine=engine_spec(proxy)) as on,
        serving(
            Path(), "--tokenizer", model, "--no-engine-stream", "--max-prompt-tokens", "1000000",
            engine=engine_spec(proxy),
        ) as off,
    ):  # fmt: skip
        yield {True: on, False: off}


@pytest.fixture(scope="module")
def lm(vllm: VLLMServer) -> CausalLM:
    return CausalLM(vllm.model_dir)


# --- the SDKs on the three protocols ---------------------------------------------------------


@pytest.mark.parametrize("engine_stream", [True, False], ids=["engine-stream", "engine-whole"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sdk_sessions_record_what_vllm_answered(
    protocol: str, stream: bool, engine_stream: bool, adapters, proxy: Recording, lm
) -> None:
    served = adapters[engine_stream]
    sid = f"{protocol}-{stream}-{engine_stream}"
    since = len(proxy.exchanges)
    run_session(served.url, protocol, sid, stream=stream)
    calls = [e for e in proxy.exchanges[since:] if e.path == "/v1/completions"]
    assert len(calls) == 2 and all(bool(e.body["stream"]) is engine_stream for e in calls)
    samples, ledger = finished_samples(served, sid)
    assert len(ledger["turns"]) == 2
    assert_recorded_as_answered(samples, ledger, proxy, since, lm)
    # vLLM 0.32 answers no weight versions on /v1/completions: they come from /weight_info.
    assert all("weight_versions" not in json.dumps(e.body) for e in calls)
    assert {v for v in ledger["weight_versions"]} == {vllm_weight_version(proxy)}


def vllm_weight_version(rec: Recording) -> str:
    (last,) = [e for e in rec.exchanges if e.path == "/weight_info"][-1:]
    return last.json()["weight_version"]


def test_weight_versions_follow_the_engines_updates(adapters, vllm: VLLMServer) -> None:
    served = adapters[True]
    try:
        vllm.post("/update_weight_version", {"new_version": "step-1"})
        run_session(served.url, "messages", "versions", stream=False)
        _, ledger = finished_samples(served, "versions")
        assert set(ledger["weight_versions"]) == {"step-1"}
    finally:
        vllm.post("/update_weight_version", {"new_version": "default"})


# --- the served context ----------------------------------------------------------------------


def long_text(tokens: int) -> str:
    return " ".join(["word"] * tokens)


def test_the_served_context_bounds_prompts_not_the_models_config(
    adapters, vllm: VLLMServer
) -> None:
    assert vllm.get("/v1/models")["data"][0]["max_model_len"] == MAX_MODEL_LEN
    config = json.loads((vllm.model_dir / "config.json").read_text())
    assert config["max_position_embeddings"] > MAX_MODEL_LEN
    client = anthropic.Anthropic(base_url=adapters[True].url, api_key="long-a", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model="m",
            max_tokens=4,
            messages=[{"role": "user", "content": long_text(MAX_MODEL_LEN + 100)}],
        )
    assert refused.value.status_code == 400
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "prompt is too long" in str(refused.value) and str(MAX_MODEL_LEN) in str(refused.value)


@pytest.mark.parametrize("sdk", ["anthropic", "openai"])
def test_vllms_refusal_of_a_prompt_is_the_protocols_400(sdk: str, adapters, proxy) -> None:
    """Past tokentrail's own bound (`--max-prompt-tokens`), vLLM refuses the prompt with a 400:
    the harness reads a 400 with vLLM's message, not a 502 an SDK would retry."""
    url = adapters[False].url
    since = len(proxy.exchanges)
    messages = [{"role": "user", "content": long_text(MAX_MODEL_LEN + 100)}]
    if sdk == "anthropic":
        client = anthropic.Anthropic(base_url=url, api_key="long-b", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(model="m", max_tokens=4, messages=messages)
        assert refused.value.body["error"]["type"] == "invalid_request_error"
    else:
        oai = openai.OpenAI(base_url=f"{url}/v1", api_key="long-c", max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            oai.chat.completions.create(model="m", max_tokens=4, messages=messages)
        assert refused.value.body["type"] == "invalid_request_error"
    assert refused.value.status_code == 400
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in str(refused.value)
    (call,) = [e for e in proxy.exchanges[since:] if e.path == "/v1/completions"]
    assert call.status == 400


# --- abort -----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine_stream", [True, False], ids=["engine-stream", "engine-whole"])
def test_a_client_that_goes_away_stops_vllms_request(
    engine_stream: bool, adapters, vllm: VLLMServer, proxy: Recording
) -> None:
    served = adapters[engine_stream]
    host, port = served.url.removeprefix("http://").split(":")
    generated = read(vllm, "vllm:generation_tokens_total")
    since = len(proxy.exchanges)
    body = {
        "model": "m",
        "max_tokens": MAX_MODEL_LEN - 64,
        "stream": True,
        "messages": [{"role": "user", "content": "Write a long story."}],
    }
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(
        "POST",
        "/v1/messages",
        json.dumps(body),
        {"Content-Type": "application/json", "x-api-key": f"abort-{engine_stream}"},
    )

    def running() -> float:
        return vllm.metric("vllm:num_requests_running")

    until(vllm, lambda: running() >= 1, 120, "the request never ran in vLLM")
    conn.sock.close()  # the harness goes away mid-turn
    # A request the abort missed is still running when this gives up: this model samples
    # about 130 tokens a second here, so max_tokens takes minutes.
    took = until(vllm, lambda: running() == 0, 120, "vLLM's request outlived its client")
    print(f"\nabort reached vLLM in {took:.2f} s")
    # Stopped, not finished: far fewer tokens sampled than asked for.
    sampled = read(vllm, "vllm:generation_tokens_total") - generated
    assert sampled < body["max_tokens"] // 2, sampled
    (call,) = [e for e in proxy.exchanges[since:] if e.path == "/v1/completions"]
    assert call.disconnected


# --- the stand-in held to the real server ----------------------------------------------------


PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]
COMPLETION = {
    "prompt": PROMPT,
    "max_tokens": 4,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "logprobs": 0,
    "return_token_ids": True,
    "skip_special_tokens": False,
    "include_stop_str_in_output": True,
}
GENERATE = {
    "token_ids": PROMPT,
    "sampling_params": {"max_tokens": 4, "logprobs": 0, "skip_special_tokens": False},
}


async def _ask(url: str, path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        method = "GET" if body is None else "POST"
        async with session.request(method, url + path, json=body) as resp:
            text = await resp.text()
            if body is not None and body.get("stream"):
                events = [
                    json.loads(line[6:])
                    for line in text.splitlines()
                    if line.startswith("data: ") and line != "data: [DONE]"
                ]
                return resp.status, events
            return resp.status, json.loads(text)


def test_the_stand_in_answers_as_vllm_does(vllm: VLLMServer) -> None:
    model = str(vllm.model_dir)
    asks: list[tuple[str, dict[str, Any] | None]] = [
        ("/v1/models", None),
        ("/v1/completions", {"model": model, **COMPLETION}),
        ("/v1/completions", {"model": model, **COMPLETION, "stream": True,
                             "stream_options": {"include_usage": True}}),
        ("/inference/v1/generate", {"model": model, **GENERATE}),
        ("/v1/completions", {"model": model, **COMPLETION, "top_p": 7.0}),
        ("/v1/completions", {"model": model, **COMPLETION, "prompt": [1] * (MAX_MODEL_LEN + 1)}),
    ]  # fmt: skip

    async def both() -> list[tuple[tuple[int, Any], tuple[int, Any]]]:
        async with FakeVLLM(model=model, dev_mode=True, max_model_len=MAX_MODEL_LEN) as fake:
            return [
                (await _ask(vllm.url, path, body), await _ask(fake.url, path, body))
                for path, body in asks
            ]

    for (path, body), ((real_status, real), (fake_status, fake)) in zip(
        asks, asyncio.run(both()), strict=True
    ):
        what = f"{path} {json.dumps(body)[:80] if body else ''}"
        assert fake_status == real_status, what
        if isinstance(real, list):  # a stream: as many events, each with vLLM's fields
            assert len(fake) == len(real), what
            for fake_event, real_event in zip(fake, real, strict=True):
                assert fields(fake_event) <= fields(real_event), (what, fake_event, real_event)
            continue
        missing = fields(real) - fields(fake)
        # vLLM's answers carry more than tokentrail reads; the stand-in has every field
        # tokentrail reads and none vLLM lacks.
        assert fields(fake) <= fields(real), (what, fields(fake) - fields(real))
        read = {"choices[].token_ids", "choices[].logprobs", "choices[].finish_reason", "usage"}
        assert not (missing & read), (what, missing & read)
        if real_status != 200:
            assert fake["error"]["code"] == real["error"]["code"] == real_status


# --- the real harnesses ----------------------------------------------------------------------


def test_a_codex_session_on_vllm(adapters, proxy: Recording, lm, tmp_path: Path) -> None:
    require_npm("Codex")
    exe = install_codex()
    assert exe is not None
    served = adapters[False]
    home = write_home(tmp_path / "home", served.url)
    work = tmp_path / "work"
    work.mkdir()
    since = len(proxy.exchanges)
    run = run_codex(exe, "Say hi.", home=home, session_id="codex-vllm", cwd=work, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    samples, ledger = finished_samples(served, "codex-vllm")
    assert ledger["turns"]
    assert_recorded_as_answered(samples, ledger, proxy, since, lm)
