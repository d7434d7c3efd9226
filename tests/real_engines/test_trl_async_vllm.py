"""TRL 1.16's async GRPO rollout worker with tokentrail capturing, over a real vLLM (its CPU
build): the default capture samples on vLLM's tokens route, and the rows the trainer would
consume hold exactly the tokens vLLM sampled with their logprobs (the tiny Qwen3 recomputes
them in torch), the follow-up user turn masked, and, with `token_versions`, the weight
version vLLM names its tokens in place of TRL's dispatch count.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import time

import openai
import pytest
import torch

trl = pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl.experimental.async_grpo import AsyncGRPOConfig, async_rollout_worker  # noqa: E402

from tokentrail.integrations.trl_async import TokentrailCapture, rollout_worker  # noqa: E402
from tokentrail.integrations.weights import VLLMWeights  # noqa: E402

GENERATIONS = 2
VERSION = "5"


@dataclasses.dataclass
class TwoTurns:
    """A harness on the official OpenAI SDK: the prompt, a reply, `Go on.`, a reply."""

    max_tokens: int = 12

    async def __call__(self, url: str, session_id: str, prompt: str) -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=session_id, max_retries=0)
        messages: list = [{"role": "user", "content": prompt}]
        replies = []
        try:
            for _ in range(2):
                answer = await client.chat.completions.create(
                    model="tiny", messages=messages, max_tokens=self.max_tokens
                )
                text = answer.choices[0].message.content or ""
                replies.append(text)
                messages += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": "Go on."},
                ]
        finally:
            await client.close()
        return replies


def words(completions, **_) -> list[float]:
    return [float(len(c[0]["content"].split())) for c in completions]


def test_the_worker_trains_on_what_vllm_sampled(vllm_servers, tmp_path, monkeypatch) -> None:
    # The trainer's environment here has no vLLM package (the server runs in its own); the
    # worker's child never imports it.
    monkeypatch.setattr(async_rollout_worker, "is_vllm_available", lambda: True)
    server = vllm_servers.get("qwen3")
    VLLMWeights(server.url).name(VERSION)
    path = server.model_dir
    args = AsyncGRPOConfig(
        output_dir=str(tmp_path / "out"),
        num_generations=GENERATIONS,
        max_inflight_tasks=4,
        vllm_server_base_url=server.url,
        use_cpu=True,
        report_to=[],
    )
    dataset = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": "Say something about trees."}]]}
    )
    capture = TokentrailCapture(harness=TwoTurns(), tokenizer=str(path), token_versions=True)
    worker = rollout_worker(
        capture,
        args,
        model_name="tiny",
        dataset=dataset,
        reward_funcs=[words],
        processing_class=AutoTokenizer.from_pretrained(str(path)),
    )
    samples = []
    worker.start()
    try:
        deadline = time.monotonic() + 600
        while len(samples) < GENERATIONS and time.monotonic() < deadline:
            try:
                samples.append(worker.rollout_buffer.get(timeout=5))
            except queue.Empty:
                worker.check_health(600)
    finally:
        worker.stop()
        VLLMWeights(server.url).name("default")

    assert len(samples) >= GENERATIONS
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    gaps = 0
    for s in samples:
        mask = s.completion_mask.astype(bool)
        start = int(mask.argmax())
        assert 0 < start
        gaps += int(not mask[start:].all())
        assert (s.old_log_probs[~mask] == 0).all()
        ids = torch.as_tensor(s.input_ids)[None]
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0].numpy()
        assert abs(logprobs[mask[1:]] - s.old_log_probs[mask]).max() < 1e-3
        # TRL dispatched the group at its version 0; the tokens say vLLM's version 5.
        assert s.model_version == int(VERSION)
    # The follow-up user turn sits masked between the two replies.
    assert gaps > 0
