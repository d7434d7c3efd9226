"""One TRL 1.16 GRPO step on CPU whose completions are tokentrail harness sessions: the tiny
real Qwen3 is both the policy TRL trains and the engine the sessions sample from (teacher-forced
on tokentrail's simulated model, since random weights would not call tools)."""

from __future__ import annotations

import dataclasses
import itertools
import os

import pytest
import torch

trl = pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from tokentrail.engines.transformers_lm import TransformersEngine  # noqa: E402
from tokentrail.integrations.session import SimulatedHarness, main_sample  # noqa: E402
from tokentrail.integrations.trl import TokentrailRollout  # noqa: E402
from tokentrail.model.tiny import tiny_model  # noqa: E402
from tokentrail.sim.harness import SessionSpec  # noqa: E402
from tokentrail.sim.model import SimulatedEngine  # noqa: E402
from tokentrail.text.tokenizer import load_tokenizer  # noqa: E402

TASKS = ["Fix the spacing in calc.py.", "Add util.py with mul()."]
SMALL = SessionSpec(steps=3, context_tokens=600, answer_words=12, think=0.0, files=2)


def test_one_grpo_step_trains_on_tokentrail_sessions(tmp_path) -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    path = tiny_model("qwen3")
    tokenizer = load_tokenizer(str(path))
    engine = TransformersEngine(path, tokenizer, inner=SimulatedEngine(tokenizer))
    seen: list[dict] = []
    seeds = itertools.count()

    async def harness(url: str, session_id: str, prompt: str):
        # A seed per session, so the sessions of one prompt differ as sampled ones do.
        spec = dataclasses.replace(SMALL, seed=next(seeds))
        return await SimulatedHarness(spec=spec)(url, session_id, prompt)

    def shorter_is_better(completions, completion_ids, tokentrail, **_) -> list[float]:
        seen.extend(tokentrail)
        return [100.0 / len(ids) for ids in completion_ids]

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_steps=1,
        learning_rate=1e-2,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        beta=0.0,
        dataloader_num_workers=0,
    )
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": t}] for t in TASKS]})
    with TokentrailRollout(engine, tokenizer, harness) as rollout:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=shorter_is_better,
            args=args,
            train_dataset=dataset,
            processing_class=AutoTokenizer.from_pretrained(str(path)),
            rollout_func=rollout,
        )
        trainer.train()
        runs = rollout.runs

    # TRL's step consumed the sessions' samples: one per completion, multi-turn, masked.
    assert len(runs) == len(seen) == args.per_device_train_batch_size
    for run, info in zip(runs, seen, strict=True):
        ledger = run.trajectory.ledger
        assert len(ledger.turns) >= 2
        assert info["trained_tokens"] == ledger.trained_tokens == ledger.generated_tokens > 0
        sample = main_sample(run.trajectory)
        assert 0 < sample.trained_tokens < sample.response_length  # tool results masked
    history = trainer.state.log_history[0]
    # TRL counted exactly the sessions' prompts and the tokens their masks train.
    fed = [main_sample(r.trajectory) for r in runs]
    assert float(history["num_tokens"]) == sum(s.prompt_length + s.trained_tokens for s in fed)
    assert float(history["grad_norm"]) > 0
    assert float(history["reward_std"]) > 0
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert changed, "the GRPO step left every weight as it was"
