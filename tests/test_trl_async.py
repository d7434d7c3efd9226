"""TRL 1.16's async GRPO rollout worker with tokentrail capturing, on CPU: the worker spawns its
child process as `AsyncGRPOTrainer` would, the child plays harness sessions through tokentrail's
adapter (the tiny real Qwen3 in process, teacher-forced on tokentrail's simulated model, which
calls tools), and the scored `RolloutSample`s the trainer would consume are tokentrail's samples:
the tokens, the loss mask (tool results masked) and the policy's logprobs of every trained token.
The trainer's own step (flash-attn tree packing) and its NCCL weight sync need a GPU."""

from __future__ import annotations

import dataclasses
import os
import queue
import time

import pytest
import torch

trl = pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl.experimental.async_grpo import AsyncGRPOConfig, async_rollout_worker  # noqa: E402

from tokentrail.engines.base import Engine  # noqa: E402
from tokentrail.engines.transformers_lm import TransformersEngine  # noqa: E402
from tokentrail.integrations.session import SessionRun, SimulatedHarness  # noqa: E402
from tokentrail.integrations.trl_async import (  # noqa: E402
    TokentrailCapture,
    TokentrailRolloutLoop,
    TokentrailRolloutWorker,
    rollout_worker,
)
from tokentrail.model.tiny import tiny_model  # noqa: E402
from tokentrail.sim.harness import SessionSpec  # noqa: E402
from tokentrail.sim.model import SimulatedEngine  # noqa: E402
from tokentrail.text.tokenizer import LoadedTokenizer  # noqa: E402

TASKS = ["Fix the spacing in calc.py.", "Add util.py with mul()."]
SMALL = SessionSpec(steps=3, context_tokens=600, answer_words=12, think=0.0, files=2)
GENERATIONS = 2


# The child process imports these by name: module level, picklable.
def tiny_engine(tokenizer: LoadedTokenizer, vllm_url: str) -> Engine:
    return TransformersEngine(tiny_model("qwen3"), tokenizer, inner=SimulatedEngine(tokenizer))


@dataclasses.dataclass
class SeededHarness:
    """The simulated harness, seeded per session so the sessions of a group differ."""

    async def __call__(self, url: str, session_id: str, prompt: str) -> object:
        spec = dataclasses.replace(SMALL, seed=int(session_id[-6:], 16))
        return await SimulatedHarness(spec=spec)(url, session_id, prompt)


def turns_reward(run: SessionRun) -> float:
    return float(len(run.trajectory.ledger.turns))


def length_reward(completion_ids, **_) -> list[float]:
    return [100.0 / max(1, len(ids)) for ids in completion_ids]


def test_the_lazy_classes_pickle_by_name() -> None:
    import pickle

    assert pickle.loads(pickle.dumps(TokentrailRolloutLoop)) is TokentrailRolloutLoop
    assert issubclass(TokentrailRolloutWorker, async_rollout_worker.AsyncRolloutWorker)


def test_the_worker_hands_the_trainer_tokentrails_samples(tmp_path, monkeypatch) -> None:
    # The worker refuses to start without vLLM installed in the trainer's environment; its child
    # never imports vLLM, and here it samples from the model in process instead.
    monkeypatch.setattr(async_rollout_worker, "is_vllm_available", lambda: True)
    path = tiny_model("qwen3")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    args = AsyncGRPOConfig(
        output_dir=str(tmp_path / "out"),
        num_generations=GENERATIONS,
        max_inflight_tasks=4,
        use_cpu=True,
        report_to=[],
    )
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": t}] for t in TASKS]})
    capture = TokentrailCapture(
        harness=SeededHarness(), tokenizer=str(path), engine=tiny_engine, reward=turns_reward
    )
    worker = rollout_worker(
        capture,
        args,
        model_name="tiny",
        dataset=dataset,
        reward_funcs=[length_reward],
        processing_class=tokenizer,
    )
    samples = []
    worker.start()
    try:
        deadline = time.monotonic() + 600
        while len(samples) < 2 * GENERATIONS and time.monotonic() < deadline:
            try:
                samples.append(worker.rollout_buffer.get(timeout=5))
            except queue.Empty:
                worker.check_health(600)  # raises the child's error, if it failed
    finally:
        worker.stop()

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    assert len(samples) == 2 * GENERATIONS
    for s in samples:
        ids = torch.as_tensor(s.input_ids)[None]
        mask = s.completion_mask.astype(bool)
        assert len(s.input_ids) == len(s.completion_mask) == len(s.old_log_probs)
        start = int(mask.argmax())
        # A multi-turn session: trained stretches with tool results between them, masked.
        assert 0 < start and mask.sum() < len(mask) - start
        assert not mask[start:].all()
        assert (s.old_log_probs[~mask] == 0).all()
        # The logprobs TRL's loss takes as the rollout's are the policy's for exactly these
        # tokens: the trainer's recompute (one position late would be far off) matches.
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0].numpy()
        assert abs(logprobs[mask[1:]] - s.old_log_probs[mask]).max() < 1e-3
        # The tokentrail reward column beside TRL's reward function.
        assert s.metrics["rewards/tokentrail_reward"] >= 2
        assert s.metrics["reward"] == pytest.approx(
            s.metrics["rewards/tokentrail_reward"] + s.metrics["rewards/length_reward"]
        )
    assert any(s.advantage != 0 for s in samples)


class RecordingTransfer:
    """TRL's weight transfer as the trainer calls it, recording the calls."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def init_weight_transfer(self) -> None:
        self.calls.append("init")

    def pause(self) -> None:
        self.calls.append("pause")

    def send_weights(self, iterator) -> None:
        self.calls.append(f"send {len(list(iterator))}")

    def resume(self) -> None:
        self.calls.append("resume")

    def destroy(self) -> None:
        self.calls.append("destroy")


def test_named_versions_name_each_sync_after_trls_count() -> None:
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    calls: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append(f"POST {self.path} {body['new_version']}")
            # The third sync's naming fails: the engine must still resume.
            self.send_response(500 if body["new_version"] == "3" else 200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        from tokentrail.errors import EngineError
        from tokentrail.integrations.trl_async import NamedVersions

        transfer = NamedVersions(
            RecordingTransfer(calls), f"http://127.0.0.1:{server.server_address[1]}"
        )
        transfer.init_weight_transfer()
        for _ in range(2):  # as AsyncGRPOTrainer._sync_weight_merged calls it
            transfer.pause()
            transfer.send_weights(iter([("w", torch.zeros(2))]))
            transfer.resume()
        transfer.pause()
        transfer.send_weights(iter([]))
        with pytest.raises(EngineError):
            transfer.resume()
        transfer.destroy()
    finally:
        server.shutdown()
        server.server_close()
    assert calls == [
        "init",
        "pause", "send 1", "POST /update_weight_version 1", "resume",
        "pause", "send 1", "POST /update_weight_version 2", "resume",
        "pause", "send 0", "POST /update_weight_version 3", "resume",
        "destroy",
    ]  # fmt: skip


def test_sampling_the_engines_cannot_do_is_refused_up_front(tmp_path) -> None:
    from tokentrail.errors import SamplingParamsError

    path = tiny_model("qwen3")
    args = AsyncGRPOConfig(output_dir=str(tmp_path), use_cpu=True, repetition_penalty=1.1)
    capture = TokentrailCapture(harness=SeededHarness(), tokenizer=str(path))
    with pytest.raises(SamplingParamsError, match="repetition_penalty"):
        rollout_worker(
            capture,
            args,
            model_name="tiny",
            dataset=Dataset.from_dict({"prompt": [TASKS]}),
            processing_class=AutoTokenizer.from_pretrained(str(path)),
        )
