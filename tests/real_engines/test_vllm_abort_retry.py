"""A weight push with `/pause?mode=abort` into a real vLLM (CPU build, the tiny Qwen3) while a
turn is being sampled. vLLM answers the turn `abort` with the tokens it had sampled (the
stand-in `FakeVLLM` answers as it does); behind `tokentrail serve --engine vllm-tokens://`, the
SDK harness still gets one normal answer: tokentrail generated the turn again once vLLM served,
under the new weights alone. The ledger says the turn was retried and how many tokens of which
version were discarded; the sample's tokens are all of the new version, and the recompute audit
under the new weights holds (and fails under the old ones: the retried tokens are the new
policy's).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from support.fake_engines import FakeVLLM
from support.real_sessions import finished_samples
from support.serve import serving
from support.vllm_server import VLLMServer, fields, read, until
from tokentrail.integrations.weights import VLLMWeights
from tokentrail.kinds import PauseMode
from tokentrail.model.audit import recompute_samples
from tokentrail.model.forward import CausalLM

MODEL = "qwen3"
PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]
# Long enough that a push lands mid-turn on two busy cores (the tiny model samples a few
# hundred tokens a second), short enough to sample twice in a few seconds.
MAX_TOKENS = 600
# The turn the bare abort cuts: it only runs this long when the abort misses it.
LONG_TURN = 4096
GENERATED = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


@pytest.fixture(scope="module")
def vllm(vllm_servers) -> VLLMServer:
    return vllm_servers.get(MODEL)


@pytest.fixture(scope="module")
def new_weights(vllm: VLLMServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its final norm tripled: another policy, in a directory vLLM
    reloads from."""
    out = tmp_path_factory.mktemp("weights") / "v1"
    shutil.copytree(vllm.model_dir, out)
    model = AutoModelForCausalLM.from_pretrained(vllm.model_dir, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(3.0)
    model.save_pretrained(out)
    return out


def post(url: str, path: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        return resp.status, json.loads(resp.read())


def when_idle(vllm: VLLMServer) -> float:
    """Until the shared server runs and queues nothing (a request an earlier test left behind
    would make `when_sampling` see tokens that are not this turn's); its generated count then."""
    until(vllm, lambda: vllm.metric(RUNNING) + vllm.metric(WAITING) == 0, 120, "vLLM stayed busy")
    return read(vllm, GENERATED)


def when_sampling(vllm: VLLMServer, before: float, tokens: int = 24) -> None:
    """Until this turn runs in vLLM and it generated `tokens` more than `before`."""

    def sampling() -> bool:
        return vllm.metric(RUNNING) >= 1 and vllm.metric(GENERATED) >= before + tokens

    until(vllm, sampling, 120, "vLLM generated nothing")


def test_vllm_answers_an_aborted_turn_with_what_it_sampled_as_the_stand_in_does(
    vllm: VLLMServer,
) -> None:
    body = {
        "model": str(vllm.model_dir),
        "token_ids": PROMPT,
        "sampling_params": {"max_tokens": LONG_TURN, "logprobs": 0, "ignore_eos": True},
    }
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        before = when_idle(vllm)
        answer = pool.submit(post, vllm.url, "/inference/v1/generate", body)
        when_sampling(vllm, before)
        assert post(vllm.url, "/pause?mode=abort", {}) == (200, {"status": "paused"})
        assert vllm.get("/is_paused") == {"is_paused": True}
        status, real = answer.result(timeout=60)
        post(vllm.url, "/resume", {})
    assert vllm.get("/is_paused") == {"is_paused": False}
    (choice,) = real["choices"]
    assert status == 200 and choice["finish_reason"] == "abort"
    sampled = len(choice["token_ids"])
    assert 0 < sampled < LONG_TURN
    assert len(choice["logprobs"]["content"]) == sampled
    assert choice["weight_versions"] == [{"version": "default", "start": 0, "end": sampled}]

    async def stand_in() -> dict[str, Any]:
        def reply(_: list[int]) -> tuple[list[int], list[float], str]:
            return [7] * MAX_TOKENS, [-1.0] * MAX_TOKENS, "length"

        async with FakeVLLM(reply, dev_mode=True, token_s=0.002) as fake:
            path = "/inference/v1/generate"
            turn = asyncio.ensure_future(asyncio.to_thread(post, fake.url, path, body))
            await asyncio.sleep(0.1)
            await asyncio.to_thread(post, fake.url, "/pause?mode=abort", {})
            _, out = await turn
            await asyncio.to_thread(post, fake.url, "/resume", {})
            return out

    fake = asyncio.run(stand_in())
    assert fake["choices"][0]["finish_reason"] == "abort"
    assert 0 < len(fake["choices"][0]["token_ids"]) < MAX_TOKENS
    # The stand-in has every field tokentrail reads, and none vLLM lacks.
    assert fields(fake) <= fields(real), fields(fake) - fields(real)


def test_a_push_with_mode_abort_mid_turn_is_retried_under_the_new_weights(
    vllm: VLLMServer, new_weights: Path
) -> None:
    model = str(vllm.model_dir)
    engine = "vllm-tokens://" + vllm.url.removeprefix("http://")
    weights = VLLMWeights(vllm.url)
    with serving(Path(), "--tokenizer", model, "--model-name", "tiny", engine=engine) as served:

        def ask() -> Any:
            client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="abort", max_retries=0)
            return client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "Tell me about the sea."}],
                # Long, so the push lands mid-turn: a 600-token turn of this tiny model
                # takes vLLM a few seconds here, and can end before a push reaches it.
                max_tokens=LONG_TURN,
                temperature=1.0,
                seed=7,
            )

        try:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                before = when_idle(vllm)
                answer = pool.submit(ask)
                when_sampling(vllm, before)
                push = weights.push(new_weights, "1", mode=PauseMode.ABORT)
                reply = answer.result(timeout=300)
            samples, ledger = finished_samples(served, "abort")
        finally:
            weights.push(vllm.model_dir, "default", mode=PauseMode.WAIT)
    print(push.to_dict(), json.dumps(ledger["turns"]))
    # The harness saw one normal answer, never the abort.
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.choices[0].message.content
    (turn,) = ledger["turns"]
    assert turn["retried"] == 1 and turn["weight_versions"] == ["1"]
    discarded = turn["discarded"]["default"]
    assert discarded > 0
    assert (ledger["turns_retried"], ledger["tokens_discarded"]) == (1, discarded)
    assert ledger["generated_tokens"] == ledger["trained_tokens"] == turn["generated"]
    (sample,) = samples
    assert {s["version"] for s in sample.metadata["weight_versions"]} == {"1"}
    # Every trained token is the new policy's: its recorded logprob is what the new weights
    # give it, not what the old ones would.
    new = recompute_samples(CausalLM(new_weights), samples)
    print(new.table())
    assert new.trained == turn["generated"] and new.within_tolerance == new.trained
    old = recompute_samples(CausalLM(vllm.model_dir), samples)
    assert old.within_tolerance < old.trained
