"""Short sessions with the official SDKs on the three protocols tokentrail serves (Anthropic
Messages, OpenAI Chat Completions, OpenAI Responses), streamed or not, and checks of what a
finished session recorded against what the engine answered (`support.vllm_server.Recording`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import Any

import anthropic
import numpy as np
import openai
import pytest

from support.serve import Served
from support.vllm_server import Exchange, Recording
from tokentrail.model.audit import DEFAULT_TOLERANCE, recompute_samples
from tokentrail.model.forward import CausalLM
from tokentrail.trajectory.sample import Sample

PROTOCOLS = ("messages", "chat", "responses")
PROMPTS = ("Say hi.", "And once more?")


def run_session(
    url: str, protocol: str, sid: str, *, stream: bool, max_tokens: int = 6
) -> list[str]:
    """Two turns of `protocol` with session id `sid` (the API key); each reply's text."""
    texts: list[str] = []
    history: list[dict[str, Any]] = []
    for prompt in PROMPTS:
        history.append({"role": "user", "content": prompt})
        text = _turn(url, protocol, sid, history, stream, max_tokens)
        texts.append(text)
        history.append({"role": "assistant", "content": text})
    return texts


def _turn(
    url: str, protocol: str, sid: str, history: list[dict[str, Any]], stream: bool, n: int
) -> str:
    if protocol == "messages":
        client = anthropic.Anthropic(base_url=url, api_key=sid, max_retries=0)
        if stream:
            with client.messages.stream(model="m", max_tokens=n, messages=history) as events:
                message = events.get_final_message()
        else:
            message = client.messages.create(model="m", max_tokens=n, messages=history)
        assert message.stop_reason in ("end_turn", "max_tokens"), message
        return "".join(b.text for b in message.content if b.type == "text")
    oai = openai.OpenAI(base_url=f"{url}/v1", api_key=sid, max_retries=0)
    if protocol == "chat":
        if stream:
            chunks = oai.chat.completions.create(
                model="m", max_tokens=n, messages=history, stream=True
            )
            parts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
            return "".join(parts)
        completion = oai.chat.completions.create(model="m", max_tokens=n, messages=history)
        assert completion.choices[0].finish_reason in ("stop", "length")
        return completion.choices[0].message.content or ""
    if stream:
        done = None
        for event in oai.responses.create(
            model="m", max_output_tokens=n, input=history, stream=True
        ):
            if event.type in ("response.completed", "response.incomplete"):
                done = event.response
        assert done is not None
        return done.output_text
    response = oai.responses.create(model="m", max_output_tokens=n, input=history)
    return response.output_text


def answered(exchanges: Sequence[Exchange]) -> list[tuple[list[int], list[float]]]:
    """The ids and logprobs each generation call was answered with, streamed or whole, from
    `/v1/completions` (`token_logprobs`) and `/inference/v1/generate` (`content[i].logprob`)."""
    out = []
    for exchange in exchanges:
        if exchange.status != 200:
            continue
        if exchange.path not in ("/v1/completions", "/inference/v1/generate"):
            continue
        streamed = bool(exchange.body.get("stream"))
        objects = exchange.events() if streamed else [exchange.json()]
        ids: list[int] = []
        logprobs: list[float] = []
        for obj in objects:
            for choice in obj.get("choices") or []:
                ids += choice.get("token_ids") or []
                lp = choice.get("logprobs") or {}
                if "token_logprobs" in lp:
                    logprobs += lp["token_logprobs"]
                else:
                    logprobs += [e["logprob"] for e in lp.get("content") or []]
        assert len(ids) == len(logprobs)
        out.append((ids, logprobs))
    return out


def check_logprobs_are_the_engines(
    samples: Sequence[Sample], answers: Sequence[tuple[list[int], list[float]]]
) -> int:
    """Every trained token of `samples` carries the logprob the engine answered for it, to the
    bit (as float32); returns how many were checked. Each run of trained tokens is found in
    an answer, in order (a turn whose history was realigned keeps a part of its answer)."""
    checked = 0
    for sample in samples:
        tokens = np.asarray(sample.tokens)[sample.prompt_length :]
        mask = np.asarray(sample.loss_mask)
        rollout = np.asarray(sample.rollout_log_probs, dtype=np.float32)
        for start, end in _runs(mask == 1):
            run = tokens[start:end]
            found = _in_answers(run, answers)
            assert found is not None, (
                f"trained tokens {run.tolist()} (response[{start}:{end}]) are in no engine "
                f"answer: {[ids for ids, _ in answers]}"
            )
            want = np.asarray(found, dtype=np.float32)
            assert np.array_equal(rollout[start:end], want), (rollout[start:end], want)
            checked += end - start
    return checked


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def _in_answers(
    run: np.ndarray, answers: Sequence[tuple[list[int], list[float]]]
) -> list[float] | None:
    """The logprobs of the first answer that holds `run` as a stretch of its ids."""
    n = len(run)
    for ids, logprobs in answers:
        got = np.asarray(ids)
        for i in range(len(got) - n + 1):
            if np.array_equal(got[i : i + n], run):
                return logprobs[i : i + n]
    return None


def finished_samples(served: Served, sid: str) -> tuple[list[Sample], dict[str, Any]]:
    finished = served.finish(sid)
    return [Sample.from_dict(s) for s in finished["samples"]], finished["ledger"]


def assert_recorded_as_answered(
    samples: list[Sample], ledger: dict[str, Any], rec: Recording, since: int, lm: CausalLM
) -> None:
    answers = answered(rec.exchanges[since:])
    assert answers, "no generation reached vLLM"
    checked = check_logprobs_are_the_engines(samples, answers)
    assert checked == sum(s.trained_tokens for s in samples) > 0
    for sample in samples:
        spans = sample.metadata["weight_versions"]
        assert spans and all(s["version"] for s in spans), sample.metadata
    assert (
        sum(v["generated"] for v in ledger["weight_versions"].values())
        == ledger["generated_tokens"]
    )
    report = recompute_samples(lm, samples)
    print(report.table())
    assert report.trained == checked
    assert report.within_tolerance == report.trained and report.max_error <= DEFAULT_TOLERANCE


def require_npm(what: str) -> None:
    if shutil.which("npm") is None:
        if os.environ.get("CI"):
            pytest.fail(f"npm is missing: cannot install {what}")
        pytest.skip(f"npm is missing: cannot install {what}")
