"""A weight push with `/pause?mode=abort` (`PauseMode.ABORT`) while turns are in flight, against
the stand-in vLLM (`FakeVLLM`, held to the real server in
`tests/real_engines/test_vllm_abort_retry.py`): vLLM answers each in-flight turn `abort` with
the tokens it had sampled; tokentrail's vLLM client waits until vLLM serves again and generates
the turn again, so the harness gets one normal answer, every token of it the new version's. The
aborted tokens are recorded (the ledger's `retried` and `discarded`, the journal), never
trained. A turn the harness gave up on stays an abort; retries are bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from support.fake_engines import IM_END, FakeVLLM
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.core.discarded import Discarded
from tokentrail.core.routing import WeightSpan
from tokentrail.engines.base import GenerateRequest, SamplingParams
from tokentrail.engines.vllm import VLLMEngine
from tokentrail.engines.vllm_generate import GENERATE_PATH
from tokentrail.integrations.weights import VLLMWeights
from tokentrail.kinds import PauseMode
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.read import read_journal
from tokentrail.storage.replay import as_recorded
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.ledger import Ledger

TEXT = "the sea is calm and the sky is grey and the boats come home one by one in the evening"
PROMPT = [IM_END - 5, 872, 198, 9707]
# Seconds per sampled token: a 25-token turn is in flight for a quarter of a second.
TOKEN_S = 0.01


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def sampled(tokenizer) -> list[int]:
    return [*tokenizer.encode(TEXT), IM_END]


def replying(ids: list[int]) -> Callable[[list[int]], tuple[list[int], list[float], str]]:
    return lambda _prompt: (ids, [-0.1 * (i % 7 + 1) for i in range(len(ids))], "stop")


def request(rid: str = "r1", max_new_tokens: int = 64) -> GenerateRequest:
    return GenerateRequest(PROMPT, SamplingParams(max_new_tokens), "s", request_id=rid)


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), timeout_s)


async def sampling(fake: FakeVLLM, path: str, requests: int, tokens: int = 6) -> None:
    """Until the fake took its `requests`-th request at `path` and sampled about `tokens`."""
    await until(lambda: len(fake.bodies(path)) >= requests)
    await asyncio.sleep(tokens * TOKEN_S)


async def push(fake: FakeVLLM, tmp_path: Path, version: str) -> None:
    await asyncio.to_thread(VLLMWeights(fake.url).push, tmp_path, version, mode=PauseMode.ABORT)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "engine-stream"])
@pytest.mark.parametrize("tokens_route", [True, False], ids=["vllm-tokens", "vllm"])
def test_a_turn_vllm_aborts_at_a_push_is_generated_again_under_the_new_weights(
    sampled: list[int], tokens_route: bool, stream: bool, tmp_path: Path
) -> None:
    path = GENERATE_PATH if tokens_route else "/v1/completions"

    async def body() -> tuple[Any, FakeVLLM]:
        fake = FakeVLLM(replying(sampled), dev_mode=True, token_s=TOKEN_S, reload_s=0.2)
        async with fake:
            engine = VLLMEngine(fake.url, model="m", tokens_route=tokens_route, stream=stream)
            turn = asyncio.ensure_future(engine.generate(request()))
            await sampling(fake, path, 1)
            await push(fake, tmp_path, "1")
            generation = await turn
            await engine.close()
        return generation, fake

    generation, fake = asyncio.run(body())
    # The harness's answer: the whole turn, sampled by the new weights alone.
    assert generation.finish_reason == "stop"
    assert generation.output_ids == sampled
    assert generation.weight_versions == (WeightSpan("1", 0, len(sampled)),)
    # What vLLM answered the first time: the tokens sampled until the pause, finish `abort`.
    first, second = fake.answered
    assert first["choices"][0]["finish_reason"] == "abort"
    assert second["choices"][0]["finish_reason"] == "stop"
    (attempt,) = generation.discarded
    assert 0 < attempt.tokens < len(sampled)
    assert list(attempt.output_ids) == first["choices"][0]["token_ids"] == sampled[: attempt.tokens]
    assert attempt.by_version() == {"default": attempt.tokens}
    # The retry went out once vLLM served again: after `/resume`, never while paused.
    calls = [c for c, _ in fake.dev_calls]
    assert calls[:1] == ["/pause?mode=abort"] and "/is_paused" in calls


def test_a_turn_the_harness_gave_up_on_stays_an_abort(sampled: list[int], tmp_path: Path) -> None:
    async def body() -> None:
        fake = FakeVLLM(replying(sampled), dev_mode=True, token_s=TOKEN_S)
        async with fake:
            engine = VLLMEngine(fake.url, model="m", tokens_route=True)
            # Gone while vLLM samples: cancelled, not asked again.
            turn = asyncio.ensure_future(engine.generate(request("gone")))
            await sampling(fake, GENERATE_PATH, 1)
            await engine.abort("gone")
            generation = await turn
            assert (generation.finish_reason, generation.discarded) == ("abort", ())
            # Gone while tokentrail waits for a paused vLLM to serve again: not asked again.
            turn = asyncio.ensure_future(engine.generate(request("waiting")))
            await sampling(fake, GENERATE_PATH, 2)
            await asyncio.to_thread(VLLMWeights(fake.url)._call, "POST", "/pause?mode=abort")
            await until(lambda: ("/is_paused", None) in fake.dev_calls)
            await engine.abort("waiting")
            generation = await asyncio.wait_for(turn, 5)
            assert generation.finish_reason == "abort" and generation.discarded == ()
            await asyncio.to_thread(VLLMWeights(fake.url)._call, "POST", "/resume")
            await asyncio.sleep(0.1)
            assert len(fake.bodies(GENERATE_PATH)) == 2
            await engine.close()

    asyncio.run(body())


def test_a_turn_whose_tokens_went_out_live_stays_an_abort(
    sampled: list[int], tmp_path: Path
) -> None:
    """A reply streamed to the harness as sampled cannot take its tokens back: once some went
    out, vLLM's abort is the turn's end, as it was sampled."""

    async def body() -> None:
        fake = FakeVLLM(replying(sampled), dev_mode=True, token_s=TOKEN_S)
        async with fake:
            engine = VLLMEngine(fake.url, model="m", tokens_route=True)
            seen: list[int] = []
            turn = asyncio.ensure_future(
                engine.generate_streaming(request(), lambda ids, _: seen.extend(ids))
            )
            await sampling(fake, GENERATE_PATH, 1)
            await push(fake, tmp_path, "1")
            generation = await turn
            await engine.close()
        assert generation.finish_reason == "abort" and generation.discarded == ()
        assert generation.output_ids == seen == sampled[: len(seen)] and seen
        assert len(fake.bodies(GENERATE_PATH)) == 1

    asyncio.run(body())


def test_retries_are_bounded(sampled: list[int], tmp_path: Path) -> None:
    async def body() -> None:
        fake = FakeVLLM(replying(sampled), dev_mode=True, token_s=TOKEN_S)
        async with fake:
            engine = VLLMEngine(fake.url, model="m", tokens_route=True, abort_retries=1)
            turn = asyncio.ensure_future(engine.generate(request()))
            await sampling(fake, GENERATE_PATH, 1)
            await push(fake, tmp_path, "1")
            await sampling(fake, GENERATE_PATH, 2)
            await push(fake, tmp_path, "2")
            generation = await turn
            await engine.close()
        # Aborted twice with one retry allowed: the second abort is the answer.
        assert generation.finish_reason == "abort"
        (attempt,) = generation.discarded
        assert attempt.tokens > 0 and attempt.by_version() == {"default": attempt.tokens}
        assert 0 < len(generation.output_ids) < len(sampled)
        assert {span.version for span in generation.weight_versions} == {"1"}
        assert len(fake.bodies(GENERATE_PATH)) == 2

    asyncio.run(body())


def test_the_ledger_and_the_journal_record_the_discarded_tokens(
    tokenizer, sampled: list[int], tmp_path: Path
) -> None:
    journal_path = tmp_path / "journal.db"

    async def body() -> tuple[Any, Any]:
        fake = FakeVLLM(replying(sampled), dev_mode=True, token_s=TOKEN_S, reload_s=0.1)
        async with fake:
            journal = Journal(journal_path)
            adapter = Adapter(
                engine=VLLMEngine(fake.url, tokenizer, model="m", tokens_route=True),
                tokenizer=tokenizer,
                config=AdapterConfig(admin_token="admin"),
                journal=journal,
            )
            runner, url = await start_server(adapter)
            try:
                client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="s1", max_retries=0)
                ask = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "The sea?"}], max_tokens=64
                )
                answer = asyncio.ensure_future(ask)
                await sampling(fake, GENERATE_PATH, 1)
                await push(fake, tmp_path, "1")
                reply = await answer
                await client.close()
                trajectory = await adapter.finish_trajectory("s1", reward=1.0)
            finally:
                await runner.cleanup()
                journal.close()
        return reply, trajectory

    reply, trajectory = asyncio.run(body())
    # The harness saw one normal answer.
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == TEXT
    ledger = trajectory.ledger.to_dict()
    (turn,) = ledger["turns"]
    discarded = turn["discarded"]["default"]
    assert 0 < discarded < len(sampled)
    assert turn["retried"] == 1 and turn["weight_versions"] == ["1"]
    assert (ledger["turns_retried"], ledger["tokens_discarded"]) == (1, discarded)
    read_back = Ledger.from_dict(ledger).to_dict()
    assert read_back["turns"] == ledger["turns"] and read_back["tokens_discarded"] == discarded
    # Only the answered turn is generated and trained; the discarded tokens are not.
    assert ledger["generated_tokens"] == ledger["trained_tokens"] == len(sampled)
    assert ledger["weight_versions"] == {"1": {"generated": len(sampled), "trained": len(sampled)}}
    (sample,) = trajectory.samples
    assert {s["version"] for s in sample.metadata["weight_versions"]} == {"1"}
    # The journal holds the aborted attempt's tokens, and recovery reads them back.
    (journaled,) = read_journal(journal_path).served_turns()
    (attempt,) = journaled.discarded
    assert list(attempt.output_ids) == sampled[:discarded]
    assert attempt.weight_versions == (WeightSpan("default", 0, discarded),)
    recovered = as_recorded(read_journal(journal_path))["s1"].ledger.to_dict()
    assert recovered["turns"][0]["discarded"] == {"default": discarded}


def test_a_discarded_attempt_round_trips_and_counts_what_no_version_names() -> None:
    attempt = Discarded.of([5, 6, 7], [-0.25, -0.5, -1.0], [WeightSpan("3", 0, 2)])
    assert Discarded.from_dict(attempt.to_dict()) == attempt
    # A span the engine left out: its tokens are counted, under `unknown`.
    assert attempt.by_version() == {"3": 2, "unknown": 1}
