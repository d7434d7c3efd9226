"""verl 0.9.1's agent loop over tokentrail sessions, on CPU, the way verl tests its agent loops
on CPU: the loop is built by `hydra.utils.instantiate` from verl's registry with the arguments
verl's `AgentLoopWorker` passes, and its `AgentLoopOutput` goes through verl's own
post-processing. The server manager answers through verl's `generate` signature with verl's
`TokenOutput`, from the tiny real Qwen3 (real logprobs) teacher-forced on tokentrail's simulated
model, since the random weights would not call tools. Skipped where verl is not installed
(CI installs it in its own step: `.ci/run`)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import numpy as np
import pytest

verl = pytest.importorskip("verl")

import hydra  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from tokentrail.engines.base import GenerateRequest, ReplayRequest, SamplingParams  # noqa: E402
from tokentrail.engines.transformers_lm import TransformersEngine  # noqa: E402
from tokentrail.integrations import verl as tt_verl  # noqa: E402
from tokentrail.model.audit import recompute_samples  # noqa: E402
from tokentrail.model.forward import CausalLM  # noqa: E402
from tokentrail.model.tiny import tiny_model  # noqa: E402
from tokentrail.sim.model import SimulatedEngine  # noqa: E402
from tokentrail.text.tokenizer import load_tokenizer  # noqa: E402
from tokentrail.trajectory.sample import Sample  # noqa: E402

TASK = "Fix the spacing in calc.py, add util.py with mul(), and write NOTES.md."
RESPONSE_LENGTH = 4096


class ModelServerManager:
    """verl's `LLMServerClient.generate` contract (token ids in; `TokenOutput` with ids and
    logprobs out) answered by a model in process, as verl's server replicas answer it."""

    def __init__(self, engine: TransformersEngine, *, routing_replay: bool = False) -> None:
        self.engine = engine
        self.calls: list[dict[str, Any]] = []
        # A server started with routing replay reports every position's routed experts.
        self.replay = ReplayRequest(0, engine.routing) if routing_replay else ReplayRequest()

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> TokenOutput:
        self.calls.append(dict(sampling_params))
        gen = await self.engine.generate(
            GenerateRequest(
                prompt_ids,
                SamplingParams(max_new_tokens=int(sampling_params["max_tokens"])),
                session_id="verl",
                request_id=request_id,
                replay=self.replay,
            )
        )
        routed = None
        if gen.routed_experts is not None:
            assert gen.routed_experts.start == 0 and gen.routed_experts.rows is not None
            routed = gen.routed_experts.rows
        return TokenOutput(
            token_ids=gen.output_ids,
            log_probs=gen.logprobs,
            routed_experts=routed,
            stop_reason="completed",
        )


@pytest.fixture(scope="module")
def qwen3_dir():
    return tiny_model("qwen3")


def verl_config(model_dir, *, routing_replay: bool = False) -> Any:
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": str(model_dir)},
                "rollout": {
                    "prompt_length": 32768,
                    "response_length": RESPONSE_LENGTH,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": -1,
                    "enable_rollout_routing_replay": routing_replay,
                },
            },
            "data": {"apply_chat_template_kwargs": {}},
        }
    )


def register_small() -> None:
    """The entry an agent-loop YAML (`agent_loop_config_path`) would register: the simulated
    harness, a small session, its requests capped (the simulated model teaching the tiny one
    plans from messages, which verl's token-only seam does not carry)."""
    session = {"steps": 3, "context_tokens": 600, "think": 0.0, "max_requests": 8}
    _agent_loop_registry["tokentrail_sim"] = OmegaConf.create(
        {
            "name": "tokentrail_sim",
            "_target_": "tokentrail.integrations.verl.TokentrailAgentLoop",
            "harness": "simulated",
            "session": session,
        }
    )


def instantiate(config: Any, server_manager: Any, model_dir) -> Any:
    """What `AgentLoopWorker._run_agent_loop` does for one sample."""
    return hydra.utils.instantiate(
        config=_agent_loop_registry["tokentrail_sim"],
        trainer_config=DictConfigWrap(config=config),
        server_manager=server_manager,
        tokenizer=AutoTokenizer.from_pretrained(str(model_dir)),
        processor=None,
        hf_model_type="qwen3",
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )


def postprocess(config: Any, output: AgentLoopOutput, tokenizer: Any) -> Any:
    """verl's own padding and masking of one agent loop's output (no Ray worker needed)."""
    worker = AgentLoopWorker.__new__(AgentLoopWorker)
    worker.config = config
    worker.rollout_config = config.actor_rollout_ref.rollout
    worker.tokenizer = tokenizer
    worker.processor = None
    worker.mm_processor_kwargs = {}
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    return asyncio.run(
        worker._agent_loop_postprocess(
            output, False, raw_prompt=[{"role": "user", "content": TASK}]
        )
    )


def test_verl_agent_loop_returns_a_harness_session_token_exactly(qwen3_dir) -> None:
    register_small()
    assert _agent_loop_registry[tt_verl.AGENT_NAME]["_target_"].endswith("TokentrailAgentLoop")
    tokenizer = load_tokenizer(str(qwen3_dir))
    engine = TransformersEngine(qwen3_dir, tokenizer, inner=SimulatedEngine(tokenizer))
    manager = ModelServerManager(engine)
    config = verl_config(qwen3_dir)

    async def rollout() -> AgentLoopOutput:
        loop = instantiate(config, manager, qwen3_dir)
        sampling = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.0,
                    "logprobs": True}  # fmt: skip
        return await loop.run(sampling, raw_prompt=[{"role": "user", "content": TASK}], index=0)

    output = asyncio.run(rollout())

    # A multi-turn session went through verl's server manager, with verl's sampling settings.
    assert len(manager.calls) >= 2
    assert all(
        c["temperature"] == 0.7 and c["top_k"] == 20 and c["logprobs"] for c in manager.calls
    )
    extra = output.extra_fields["tokentrail"]
    ledger = extra["ledger"]
    assert ledger["generated_tokens"] > 0
    assert (
        ledger["trained_tokens"] + sum(ledger["masked_tokens"].values())
        == ledger["generated_tokens"]
    )
    assert len(output.response_ids) == len(output.response_mask) == len(output.response_logprobs)
    assert output.num_turns == 2 * len(ledger["turns"]) >= 4
    # The sample is what the model computed: recompute every trained token's logprob.
    sample = Sample(
        tokens=np.asarray(output.prompt_ids + output.response_ids, dtype=np.uint32),
        loss_mask=np.asarray(output.response_mask, dtype=np.uint8),
        rollout_log_probs=np.asarray(output.response_logprobs, dtype=np.float32),
        response_length=len(output.response_ids),
    )
    assert sample.trained_tokens == sum(output.response_mask) > 0
    report = recompute_samples(CausalLM(qwen3_dir), [sample])
    assert report.trained == sample.trained_tokens
    assert report.within_tolerance == report.trained, report.table()
    # Tool results are in the response and masked: not every response token is trained.
    assert 0 < sum(output.response_mask) < len(output.response_mask)

    # verl's own post-processing takes it: padding, attention mask, logprobs aligned.
    hf_tok = AutoTokenizer.from_pretrained(str(qwen3_dir))
    internal = postprocess(config, output, hf_tok)
    assert internal.response_ids.shape == (1, RESPONSE_LENGTH)
    n = len(output.response_ids)
    assert internal.response_ids[0, :n].tolist() == output.response_ids
    assert internal.response_mask[0, :n].tolist() == output.response_mask
    assert int(internal.response_mask.sum()) == sum(output.response_mask)
    assert internal.response_logprobs[0, :n].tolist() == pytest.approx(output.response_logprobs)
    assert output.as_dict()["rollout_log_probs"].shape == (n,)


def test_verl_agent_loop_returns_the_routed_experts_of_a_real_moe() -> None:
    moe_dir = tiny_model("qwen3-moe")
    tokenizer = load_tokenizer(str(moe_dir))
    engine = TransformersEngine(moe_dir, tokenizer, inner=SimulatedEngine(tokenizer))
    manager = ModelServerManager(engine, routing_replay=True)
    config = verl_config(moe_dir, routing_replay=True)
    tt_verl._HOSTS._hosts.clear()
    register_small()

    async def rollout() -> AgentLoopOutput:
        loop = instantiate(config, manager, moe_dir)
        return await loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": TASK}])

    output = asyncio.run(rollout())
    n = len(output.prompt_ids) + len(output.response_ids)
    routing = engine.routing
    assert routing is not None
    assert output.routed_experts.shape == (n, routing.layers, routing.top_k)
    sample = Sample(
        tokens=np.asarray(output.prompt_ids + output.response_ids, dtype=np.uint32),
        loss_mask=np.asarray(output.response_mask, dtype=np.uint8),
        rollout_log_probs=np.asarray(output.response_logprobs, dtype=np.float32),
        response_length=len(output.response_ids),
        routed_experts=np.asarray(output.routed_experts),
    )
    report = recompute_samples(CausalLM(moe_dir), [sample])
    assert report.within_tolerance == report.trained > 0, report.table()
    # Every position fed forward routes as the session recorded (the last is never fed).
    assert report.routed_positions == n - 1
    assert report.routing_share == 1.0, report.table()
    # verl's post-processing places the rows at the sequence's positions (left padding).
    internal = postprocess(config, output, AutoTokenizer.from_pretrained(str(moe_dir)))
    left = internal.prompt_ids.shape[1] - len(output.prompt_ids)
    assert internal.routed_experts[0, left : left + n].tolist() == output.routed_experts.tolist()


def test_engine_refuses_a_server_answer_without_logprobs(qwen3_dir) -> None:
    class NoLogprobs:
        async def generate(self, request_id: str, **_: Any) -> TokenOutput:
            return TokenOutput(token_ids=[1, 2, 3], log_probs=None)

    engine = tt_verl.ServerManagerEngine(NoLogprobs(), load_tokenizer(str(qwen3_dir)))
    req = GenerateRequest([1, 2], SamplingParams(max_new_tokens=4), session_id=uuid.uuid4().hex)
    with pytest.raises(tt_verl.EngineError, match="no logprobs"):
        asyncio.run(engine.generate(req))
