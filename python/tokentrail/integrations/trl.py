"""TRL (1.16): tokentrail as the capture layer of `GRPOTrainer(rollout_func=...)`.

TRL's entry point for multi-turn agent rollouts a harness plays is `rollout_func`: it gets the
prompts of a step and returns, per completion, `prompt_ids`, `completion_ids`, `logprobs` and
`env_mask` (1 for the model's tokens, 0 for the environment's, which TRL masks from the loss).
`TokentrailRollout` is one: each prompt becomes a tokentrail session that a harness plays
against an adapter over any tokentrail engine (SGLang, vLLM, a model in process), and its
sample is handed to TRL token-exactly; the ledger goes to the reward functions as
`tokentrail`. TRL is not imported here: the module only speaks its `rollout_func` contract.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from tokentrail.adapter.config import AdapterConfig
from tokentrail.engines.base import Engine
from tokentrail.integrations.session import (
    Harness,
    SessionHost,
    SessionRun,
    SimulatedHarness,
    main_sample,
    prompt_text,
)
from tokentrail.text.tokenizer import LoadedTokenizer

logger = logging.getLogger(__name__)

T = TypeVar("T")


class TokentrailRollout:
    """A `rollout_func` for TRL's `GRPOTrainer`: one tokentrail session per prompt.

        with TokentrailRollout(engine, tokenizer, SimulatedHarness()) as rollout:
            GRPOTrainer(model=..., rollout_func=rollout, ...).train()

    The adapter runs in a thread of its own (TRL calls `rollout_func` synchronously); all of a
    step's sessions run at once. TRL trains one sequence per completion: a session with
    several samples (forks, sub-agents) gives its main one (`main_sample`), and the ledger
    says what the others held."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: LoadedTokenizer,
        harness: Harness | None = None,
        *,
        config: AdapterConfig | None = None,
    ) -> None:
        self.harness = harness or SimulatedHarness()
        self.tokenizer = tokenizer
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tokentrail-trl", daemon=True
        )
        self._thread.start()
        self.host: SessionHost = self._run(self._start(engine, tokenizer, config))
        self.runs: list[SessionRun] = []

    async def _start(
        self, engine: Engine, tokenizer: LoadedTokenizer, config: AdapterConfig | None
    ) -> SessionHost:
        host = SessionHost(engine, tokenizer, config=config)
        await host.start()
        return host

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __call__(self, prompts: Sequence[Any], trainer: Any = None) -> dict[str, Any]:
        """TRL's `rollout_func(prompts, trainer)`: one completion per prompt, in order."""

        async def all_sessions() -> list[SessionRun]:
            return await asyncio.gather(
                *(self.host.run(self.harness, prompt_text(p)) for p in prompts)
            )

        runs = self._run(all_sessions())
        self.runs = runs
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            "tokentrail": [],
        }
        for run in runs:
            sample = main_sample(run.trajectory)
            tokens = sample.tokens.tolist()
            out["prompt_ids"].append(tokens[: sample.prompt_length])
            out["completion_ids"].append(tokens[sample.prompt_length :])
            out["logprobs"].append(sample.rollout_log_probs.tolist())
            out["env_mask"].append(sample.loss_mask.tolist())
            out["tokentrail"].append(
                {
                    "session_id": run.session_id,
                    "ledger": run.trajectory.ledger.to_dict(),
                    "samples": len(run.trajectory.samples),
                    "trained_tokens": sample.trained_tokens,
                }
            )
        return out

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self.host.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def __enter__(self) -> TokentrailRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["TokentrailRollout"]
