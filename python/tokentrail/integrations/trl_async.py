"""TRL (1.16) async GRPO (`trl.experimental.async_grpo`): tokentrail as its rollout worker's
capture layer.

`AsyncGRPOTrainer` owns the loop: a rollout worker in a spawned child process plays rollouts
against the trainer's vLLM server and pushes scored `RolloutSample`s (`input_ids`,
`completion_mask`, `old_log_probs`, one advantage, a `model_version`) onto a queue the trainer
drains. `TokentrailRolloutWorker` is that worker with tokentrail capturing: each rollout is a
tokentrail session a `Harness` plays against tokentrail's adapter over the worker's vLLM
(`vllm-tokens://`, or any tokentrail engine), and each of the session's samples is one training
row, token-exact: the sample's tokens, its loss mask as TRL's `completion_mask` (tool results
and other environment tokens masked), the logprobs the engine reported. TRL is imported when
the worker class is first used, not with this module.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from tokentrail.engines.base import Engine
from tokentrail.engines.registry import create_engine
from tokentrail.errors import SamplingParamsError
from tokentrail.integrations.session import Harness, SessionHost, SessionRun, prompt_text
from tokentrail.integrations.weights import VLLMWeights
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer
from tokentrail.trajectory.sample import Sample
from tokentrail.trajectory.staleness import NO_STEP, token_steps

logger = logging.getLogger(__name__)

# Builds the engine in the worker's child process from the tokenizer and the worker's vLLM URL.
EngineFactory = Callable[[LoadedTokenizer, str], Engine]


@dataclass(frozen=True)
class TokentrailCapture:
    """What the worker's child needs to capture through tokentrail. It crosses into a spawned
    process, so every field must pickle (module-level functions, dataclass instances).

    - `harness`: plays each rollout (`SimulatedHarness`, `CommandHarness`, your own);
    - `tokenizer`: the policy's tokenizer (a local directory or a Hub name);
    - `engine`: a tokentrail engine spec, or a factory `(tokenizer, vllm_url) -> Engine`;
      `None` samples from the worker's vLLM on its tokens route (`vllm-tokens://`), whose
      answers name each token's weight version;
    - `reward`: a rollout reward from the finished session (`None` for "no opinion"), summed
      with TRL's `reward_funcs` as the column `tokentrail_reward`;
    - `token_versions`: stamp each row's `model_version` with the oldest weight version among
      its trained tokens instead of the version when its group was dispatched. Only when the
      weights are pushed under TRL's version numbers (vLLM's own starts as `default`, read as 0).
    """

    harness: Harness
    tokenizer: str
    engine: str | EngineFactory | None = None
    reward: Callable[[SessionRun], float | None] | None = None
    token_versions: bool = False

    def build_engine(self, tokenizer: LoadedTokenizer, vllm_url: str) -> Engine:
        if self.engine is None:
            address = vllm_url.rstrip("/").split("://", 1)[-1]
            return create_engine(f"vllm-tokens://{address}", tokenizer)
        if isinstance(self.engine, str):
            return create_engine(self.engine, tokenizer)
        return self.engine(tokenizer, vllm_url)


@dataclass(frozen=True)
class Row:
    """One training row in TRL's layout: the whole sequence, prompt included; the mask and the
    logprobs cover it all (zeros over the prompt)."""

    input_ids: list[int]
    completion_mask: list[int]
    old_log_probs: list[float]
    oldest_version: int | None


def training_row(sample: Sample, versions: bool = False) -> Row:
    """`sample` as TRL's `TrainingSequence` holds it; with `versions`, the oldest weight version
    (an integer: `trajectory.staleness.step_of`) among its trained tokens as well."""
    prompt = sample.prompt_length
    trained = sample.loss_mask.astype(bool)
    steps = token_steps(sample)[trained] if versions else np.zeros(0, dtype=np.int64)
    known = steps[steps != NO_STEP]
    return Row(
        input_ids=sample.tokens.tolist(),
        completion_mask=[0] * prompt + sample.loss_mask.astype(np.int64).tolist(),
        old_log_probs=[0.0] * prompt + np.where(trained, sample.rollout_log_probs, 0.0).tolist(),
        oldest_version=int(known.min()) if known.size else None,
    )


def training_rows(run: SessionRun, versions: bool = False) -> list[Row]:
    """Every sample of a session (forks and sub-agents are samples of their own) that trains a
    token, one row each: TRL stamps the rollout's one advantage on all of them."""
    return [training_row(s, versions) for s in run.trajectory.samples if s.loss_mask.any()]


def model_tokens(run: SessionRun) -> list[int]:
    """The tokens the model sampled in the session's last sample, in order."""
    if not run.trajectory.samples:
        return []
    sample = run.trajectory.samples[-1]
    response = sample.tokens[sample.prompt_length :]
    return response[sample.loss_mask.astype(bool)].tolist()


def sampling_defaults(settings: Any) -> dict[str, Any]:
    """The worker's (or an `AsyncGRPOConfig`'s) sampling settings as a session's defaults (a
    harness's own request wins). tokentrail's engines take no `min_p` or
    `repetition_penalty`: set, they are refused here rather than at every turn."""
    for name, unset in (("min_p", None), ("repetition_penalty", 1.0)):
        if getattr(settings, name) != unset:
            raise SamplingParamsError(
                f"{name}={getattr(settings, name)}: tokentrail's engines do not take {name}"
            )
    out: dict[str, Any] = {"temperature": settings.temperature, "top_p": settings.top_p}
    if settings.top_k and settings.top_k > 0:
        out["top_k"] = settings.top_k
    return out


@functools.cache
def _trl_classes() -> SimpleNamespace:
    """The TRL subclasses, built on first use. They carry this module's name, so pickle (the
    worker spawns its child) finds them through the module's `__getattr__`."""
    from trl.experimental.async_grpo.async_rollout_worker import (
        AsyncRolloutWorker,
        TrainingSequence,
        _AsyncRolloutLoop,
    )

    class TokentrailRolloutLoop(_AsyncRolloutLoop):
        """TRL's generate and score loops, each rollout a tokentrail session."""

        _provides_rollout_reward = True
        _EMPTY_ROLLOUT: tuple[Any, ...] = ([], [], [], 0, 0, None)

        def __init__(self, *, tokentrail: TokentrailCapture, **loop_kwargs: Any) -> None:
            tokenizer = loop_kwargs["processing_class"]
            if (
                getattr(tokenizer, "response_template", None) is None
                and getattr(tokenizer, "response_schema", None) is None
            ):
                # TRL refuses a chat template it cannot parse replies of; tokentrail's adapter
                # parses the replies here, TRL's parser is never called (this is the child's
                # copy of the tokenizer).
                tokenizer.response_template = {}
            super().__init__(**loop_kwargs)
            self.reward_func_names.append("tokentrail_reward")
            self.capture = tokentrail
            self.host: SessionHost | None = None
            self.oldest: dict[str, int | None] = {}

        async def _run_loops(self, stop_event: Any) -> None:
            tokenizer = load_tokenizer(self.capture.tokenizer)
            engine = self.capture.build_engine(tokenizer, self.vllm_server_url)
            async with SessionHost(engine, tokenizer) as host:
                self.host = host
                try:
                    await super()._run_loops(stop_event)
                finally:
                    self.host = None

        async def _generate_one(
            self, prompt: Any, tool_dict: Any, tools: Any, group_id: int = 0
        ) -> tuple[Any, ...]:
            assert self.host is not None
            started = time.monotonic()
            try:
                run = await self.host.run(
                    self.capture.harness,
                    prompt_text(prompt),
                    metadata={"group_id": group_id},
                    sampling_defaults=sampling_defaults(self),
                )
            except Exception:
                # As TRL's harness worker: a session that failed, whatever failed (the harness,
                # the engine), is unscorable and trains nothing; the worker goes on.
                logger.warning("session failed; the rollout is left out", exc_info=True)
                return self._EMPTY_ROLLOUT
            rows = training_rows(run, self.capture.token_versions)
            sequences = [
                TrainingSequence(r.input_ids, r.completion_mask, r.old_log_probs, run.session_id)
                for r in rows
            ]
            for index, row in enumerate(rows):
                self.oldest[f"{run.session_id}/{index}"] = row.oldest_version
            ids = model_tokens(run)
            completion = [{"role": "assistant", "content": self.tokenizer.decode(ids)}]
            reward = self.capture.reward(run) if self.capture.reward is not None else None
            turns = len(run.trajectory.ledger.turns)
            self._push_rollout_metrics(
                turns=turns,
                sequences=len(sequences),
                completion_ids=ids,
                tally={"transitions": 0.0, "drift_max": 0.0},
                loop_exhausted=False,
                duration_s=time.monotonic() - started,
            )
            return completion, ids, sequences, 0, 0, reward

        async def _score_group(self, group: Any) -> list[Any]:
            samples = await super()._score_group(group)
            keys = [
                f"{seq.rollout_id}/{index}"
                for seqs in group.completions_sequences
                for index, seq in enumerate(seqs)
            ]
            for sample, key in zip(samples, keys, strict=True):
                oldest = self.oldest.pop(key, None)
                if self.capture.token_versions and oldest is not None:
                    sample.model_version = oldest
            return samples

    class TokentrailRolloutWorker(AsyncRolloutWorker):
        """TRL's `AsyncRolloutWorker` whose rollouts are tokentrail sessions: pass
        `tokentrail=TokentrailCapture(...)` with the worker's usual keyword arguments."""

        _loop_cls = TokentrailRolloutLoop

    for cls in (TokentrailRolloutLoop, TokentrailRolloutWorker):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
    return SimpleNamespace(
        TokentrailRolloutLoop=TokentrailRolloutLoop,
        TokentrailRolloutWorker=TokentrailRolloutWorker,
    )


class NamedVersions:
    """A TRL `weight_transfer` (`WeightTransferProtocol`) around another, that names each sync's
    weights in vLLM after TRL's version count: `str(n)` after the n-th send, the number TRL's
    trainer stamps on the rollouts it dispatches next. TRL's own `WeightTransferClient` names
    none, so vLLM calls them all `default`; behind this, `TokentrailCapture(token_versions=True)`
    reads each token's TRL version.

        trainer = AsyncGRPOTrainer(...)
        trainer.weight_transfer = NamedVersions(trainer.weight_transfer, args.vllm_server_base_url)
    """

    def __init__(self, inner: Any, vllm_url: str) -> None:
        self.inner = inner
        self.weights = VLLMWeights(vllm_url)
        self.sent = 0

    def init_weight_transfer(self) -> None:
        self.inner.init_weight_transfer()

    def pause(self) -> None:
        self.inner.pause()

    def send_weights(self, iterator: Any) -> None:
        self.inner.send_weights(iterator)
        self.sent += 1

    def resume(self) -> None:
        try:
            self.weights.name(str(self.sent))
        finally:
            self.inner.resume()

    def destroy(self) -> None:
        self.inner.destroy()


def rollout_worker(
    capture: TokentrailCapture,
    args: Any,
    *,
    model_name: str,
    dataset: Any,
    reward_funcs: Sequence[Callable[..., Any]] = (),
    processing_class: Any,
    eos_token_ids: Sequence[int] | None = None,
) -> Any:
    """A `TokentrailRolloutWorker` set up from an `AsyncGRPOConfig` as the trainer would set up
    its own worker: pass it as `AsyncGRPOTrainer(rollout_worker=...)`."""
    sampling_defaults(args)  # refuses what the sessions could not sample with, up front
    worker_cls = _trl_classes().TokentrailRolloutWorker
    eos = list(eos_token_ids) if eos_token_ids is not None else [processing_class.eos_token_id]
    return worker_cls(
        tokentrail=capture,
        model_name=model_name,
        dataset=dataset,
        reward_funcs=list(reward_funcs),
        processing_class=processing_class,
        eos_token_ids=eos,
        num_generations=args.num_generations,
        max_inflight_tasks=args.max_inflight_tasks,
        queue_maxsize=args.queue_maxsize,
        vllm_server_url=args.vllm_server_base_url,
        max_tokens=args.max_completion_length,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        request_timeout=args.request_timeout,
        chat_template_kwargs=args.chat_template_kwargs,
        log_completions=args.log_completions,
        num_completions_to_print=args.num_completions_to_print,
    )


def __getattr__(name: str) -> Any:
    if name in ("TokentrailRolloutLoop", "TokentrailRolloutWorker"):
        return getattr(_trl_classes(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# `TokentrailRolloutWorker` and `TokentrailRolloutLoop` are attributes too, built with TRL on
# first use (`__getattr__`).
__all__ = [
    "NamedVersions",
    "Row",
    "TokentrailCapture",
    "rollout_worker",
    "training_row",
    "training_rows",
]
