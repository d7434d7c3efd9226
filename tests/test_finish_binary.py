"""`/finish` in binary: by `Accept`, the samples come as an npz archive or an Arrow IPC stream,
and `read_finish` reads them back to exactly the JSON answer's samples (tokens, loss masks,
logprobs, routed experts, metadata), ledger and loss. A simulated MoE engine (48 layers x
top-8) answers every turn's routed experts, over real sockets and the Anthropic SDK."""

from __future__ import annotations

import asyncio
import urllib.request
from functools import partial
from typing import Any

import anthropic
import numpy as np
import pytest

from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.core.routing import RoutingShape
from tokentrail.integrations.finish_http import finish_over_http
from tokentrail.sim.model import SimulatedEngine
from tokentrail.sim.moe import MoEEngine
from tokentrail.storage.finish_wire import FinishFormat, pick_format, read_finish
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.manager import TrajectoryManager

TOKEN = "admin"


def finish(url: str, sid: str, accept: str | None) -> tuple[str, bytes]:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    if accept is not None:
        headers["Accept"] = accept
    req = urllib.request.Request(
        f"{url}/tokentrail/sessions/{sid}/finish", b'{"reward": 0.5}', headers, method="POST"
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.headers["Content-Type"], resp.read()


@pytest.fixture(scope="module")
def answers() -> dict[str, Any]:
    tokenizer = load_tokenizer()
    adapter = Adapter(
        engine=MoEEngine(SimulatedEngine(tokenizer)),
        tokenizer=tokenizer,
        manager=TrajectoryManager(routing=RoutingShape(48, 8, 128)),
        config=AdapterConfig(routed_experts=True, admin_token=TOKEN),
    )

    async def go() -> dict[str, Any]:
        runner, url = await start_server(adapter)
        try:
            client = anthropic.AsyncAnthropic(base_url=url, api_key="moe", max_retries=0)
            messages: list = [{"role": "user", "content": "Fix the failing test in utils.py."}]
            for _ in range(3):
                reply = await client.messages.create(model="m", max_tokens=64, messages=messages)
                messages += [
                    {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
                    {"role": "user", "content": "Go on."},
                ]
            out: dict[str, Any] = {}
            for accept in (None, FinishFormat.NPZ, FinishFormat.ARROW):
                out[str(accept)] = await asyncio.to_thread(finish, url, "moe", accept)
            out["helper"] = await asyncio.to_thread(
                partial(finish_over_http, url, "moe", admin_token=TOKEN, reward=0.5)
            )
            return out
        finally:
            await runner.cleanup()

    return asyncio.run(go())


@pytest.mark.parametrize("fmt", [FinishFormat.NPZ, FinishFormat.ARROW])
def test_the_binary_answer_is_the_json_answers_samples(answers, fmt: FinishFormat) -> None:
    json_type, json_body = answers["None"]
    assert json_type.startswith("application/json")
    expected = read_finish(json_body, json_type)
    content_type, body = answers[str(fmt)]
    assert content_type == str(fmt)
    got = read_finish(body, content_type)
    assert len(got.samples) == len(expected.samples) >= 1
    for a, b in zip(got.samples, expected.samples, strict=True):
        assert a.tokens.dtype == np.uint32 and np.array_equal(a.tokens, b.tokens)
        assert np.array_equal(a.loss_mask, b.loss_mask)
        assert a.rollout_log_probs.dtype == np.float32
        assert np.array_equal(a.rollout_log_probs, b.rollout_log_probs)
        assert a.routed_experts is not None and b.routed_experts is not None
        assert a.routed_experts.shape == b.routed_experts.shape == (len(a.tokens), 48, 8)
        assert a.routed_experts.dtype == b.routed_experts.dtype
        assert np.array_equal(a.routed_experts, b.routed_experts)
        assert (a.response_length, a.reward, a.metadata) == (
            b.response_length,
            b.reward,
            b.metadata,
        )
    assert got.ledger == expected.ledger and got.lost == expected.lost
    # Typed arrays: a fraction of the JSON's bytes.
    assert len(body) < len(json_body) / 3


def test_accept_picks_the_format() -> None:
    assert pick_format(None) is FinishFormat.JSON
    assert pick_format("application/json") is FinishFormat.JSON
    assert pick_format("*/*") is FinishFormat.JSON
    assert pick_format("application/x-npz") is FinishFormat.NPZ
    arrow = "application/vnd.apache.arrow.stream"
    assert pick_format(f"application/x-npz;q=0.5, {arrow}") is FinishFormat.ARROW
    assert pick_format(f"application/json, {arrow};q=0") is FinishFormat.JSON


def test_the_client_helper_reads_the_same_samples(answers) -> None:
    content_type, body = answers["None"]
    expected = read_finish(body, content_type)
    got = answers["helper"]
    assert [s.tokens.tolist() for s in got.samples] == [s.tokens.tolist() for s in expected.samples]
    for a, b in zip(got.samples, expected.samples, strict=True):
        assert np.array_equal(a.routed_experts, b.routed_experts)
        assert np.array_equal(a.rollout_log_probs, b.rollout_log_probs)
    assert got.ledger == expected.ledger
