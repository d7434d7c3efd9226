"""One GRPO step with TRL on CPU whose completions are tokentrail harness sessions.

Each prompt becomes a session that a harness (here tokentrail's simulated Claude Code; a real
CLI through `CommandHarness(["claude", "-p", "{prompt}"])`) plays against tokentrail's adapter;
TRL receives each session's prompt ids, completion ids, logprobs and the loss mask as
`env_mask`. The tiny real Qwen3 is the policy; on a cluster the engine is your SGLang or vLLM
server: `create_engine("vllm://10.0.0.5:8000", tokenizer)`.

    pip install 'tokentrail[trl,model]' && python examples/trl_grpo.py
"""

import os
import tempfile

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from tokentrail.engines.transformers_lm import TransformersEngine
from tokentrail.integrations.session import SimulatedHarness
from tokentrail.integrations.trl import TokentrailRollout
from tokentrail.model.tiny import tiny_model
from tokentrail.sim.harness import SessionSpec
from tokentrail.sim.model import SimulatedEngine
from tokentrail.text.tokenizer import load_tokenizer


def reward(completions, completion_ids, tokentrail, **_):
    # Your verifier goes here; this one prefers shorter sessions. `tokentrail` holds each
    # session's ledger: its trained and masked tokens, per turn and tool.
    return [100.0 / len(ids) for ids in completion_ids]


def main() -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    path = tiny_model("qwen3")
    tokenizer = load_tokenizer(str(path))
    # The tiny model's random weights would not call tools: it scores the simulated model's
    # replies (real logprobs), as `--engine transformers:tiny:qwen3+simulated` does.
    engine = TransformersEngine(path, tokenizer, inner=SimulatedEngine(tokenizer))
    harness = SimulatedHarness(spec=SessionSpec(steps=3, context_tokens=600, think=0.0))
    prompts = ["Fix the spacing in calc.py.", "Add util.py with mul()."]
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts]})
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=1,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        beta=0.0,
    )
    with TokentrailRollout(engine, tokenizer, harness) as rollout:
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(str(path)),
            reward_funcs=reward,
            args=args,
            train_dataset=dataset,
            processing_class=AutoTokenizer.from_pretrained(str(path)),
            rollout_func=rollout,
        )
        trainer.train()
        for run in rollout.runs:
            ledger = run.trajectory.ledger
            print(
                f"{run.session_id}: {len(ledger.turns)} turns, "
                f"{ledger.trained_tokens}/{ledger.generated_tokens} generated tokens trained"
            )
    print(trainer.state.log_history[0])


if __name__ == "__main__":
    main()
