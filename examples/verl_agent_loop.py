"""verl's agent loop over a tokentrail session, run on CPU the way verl's worker runs it.

In a verl run, point the rollout at an agent-loop config and name the loop in the data:

    # agent_loops.yaml
    - name: tokentrail_agent
      _target_: tokentrail.integrations.verl.TokentrailAgentLoop
      harness: simulated            # or [claude, -p, "{prompt}"], or my_pkg.harness:run

    actor_rollout_ref.rollout.agent.agent_loop_config_path=agent_loops.yaml
    actor_rollout_ref.rollout.agent.default_agent_loop=tokentrail_agent

verl then hands the loop its server manager, and every turn the harness sends is generated
there. This script builds the loop as verl's `AgentLoopWorker` does (`hydra.utils.instantiate`
from verl's registry) and gives it a server manager with verl's `generate` contract backed by
the tiny real Qwen3 in process, so it runs without a GPU:

    pip install 'tokentrail[verl,model]' && python examples/verl_agent_loop.py
"""

import asyncio
from typing import Any

import hydra
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import (
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

from tokentrail.engines.base import GenerateRequest, SamplingParams
from tokentrail.engines.transformers_lm import TransformersEngine
from tokentrail.integrations.verl import AGENT_NAME
from tokentrail.model.tiny import tiny_model
from tokentrail.sim.model import SimulatedEngine
from tokentrail.text.tokenizer import load_tokenizer


class InProcessServerManager:
    """verl's `LLMServerClient.generate`: prompt ids in, `TokenOutput` (ids, logprobs) out."""

    def __init__(self, engine: TransformersEngine) -> None:
        self.engine = engine

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_: Any) -> TokenOutput:
        sampling = SamplingParams(max_new_tokens=int(sampling_params["max_tokens"]))
        gen = await self.engine.generate(
            GenerateRequest(prompt_ids, sampling, session_id="verl", request_id=request_id)
        )
        return TokenOutput(token_ids=gen.output_ids, log_probs=gen.logprobs)


async def main() -> None:
    path = tiny_model("qwen3")
    tokenizer = load_tokenizer(str(path))
    engine = TransformersEngine(path, tokenizer, inner=SimulatedEngine(tokenizer))
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": str(path)},
                "rollout": {"prompt_length": 32768, "response_length": 16384},
            },
            "data": {"apply_chat_template_kwargs": {}},
        }
    )
    # What an agent-loop YAML entry registers. The simulated model teaching the tiny one plans
    # from the request's messages, which verl's token-only seam does not carry: the session's
    # size is set here (steps, context) instead.
    _agent_loop_registry["tokentrail_small"] = OmegaConf.create(
        {
            "name": "tokentrail_small",
            "_target_": _agent_loop_registry[AGENT_NAME]["_target_"],
            "harness": "simulated",
            "session": {"steps": 3, "context_tokens": 600, "think": 0.0, "max_requests": 8},
        }
    )
    loop = hydra.utils.instantiate(
        config=_agent_loop_registry["tokentrail_small"],
        trainer_config=DictConfigWrap(config=config),
        server_manager=InProcessServerManager(engine),
        tokenizer=AutoTokenizer.from_pretrained(str(path)),
        processor=None,
        hf_model_type="qwen3",
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )
    task = [{"role": "user", "content": "Fix the spacing in calc.py and write NOTES.md."}]
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    output = await loop.run(sampling, raw_prompt=task, index=0)
    ledger = output.extra_fields["tokentrail"]["ledger"]
    print(
        f"prompt {len(output.prompt_ids)} tokens, response {len(output.response_ids)} tokens, "
        f"{sum(output.response_mask)} trained, {output.num_turns // 2} turns; "
        f"ledger: {ledger['trained_tokens']}/{ledger['generated_tokens']} generated tokens trained"
    )


if __name__ == "__main__":
    asyncio.run(main())
