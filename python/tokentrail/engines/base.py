"""The contract between the adapter and an inference engine: token ids in, token ids out.

An `Engine` turns a `GenerateRequest` (prompt ids, sampling, session and request ids, and which
replay data to report) into a `Generation` (sampled ids with one logprob each, the replay rows
asked for, the weight versions). `registry.create_engine` builds one from a spec string.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from tokentrail.core.discarded import Discarded
from tokentrail.core.routing import (
    IndexerShape,
    ReplayRows,
    RoutingShape,
    WeightSpan,
    checked_rows,
)
from tokentrail.errors import EngineOutputError, SamplingParamsError
from tokentrail.kinds import EngineFault, FinishReason, Replay, ReplayGap
from tokentrail.messages import ImageInput, Message, ToolSchema
from tokentrail.text.constraints import OutputConstraint

logger = logging.getLogger(__name__)

FINISH_REASONS = tuple(r.value for r in FinishReason)

# Every request carries the session id under both names. `X-SMG-Routing-Key` is the header the
# SGLang Model Gateway (sglang-router) hashes under its `consistent_hashing` and `manual`
# policies, so every turn of a session lands on the worker that holds its prefix in KV cache;
# `X-Session-Id` is the plain name other routers and logs can key on.
ROUTING_HEADER = "X-SMG-Routing-Key"
SESSION_HEADER = "X-Session-Id"
REQUEST_ID_HEADER = "X-Request-Id"


@dataclass
class SamplingParams:
    """How to sample one turn. `top_k=-1` means no top-k; `stop` holds stop strings."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    def merged(self, overrides: Mapping[str, Any]) -> SamplingParams:
        """A copy with `overrides` applied; a `None` value leaves that parameter as it is."""
        known = {f.name for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for key, value in overrides.items():
            if key not in known:
                raise SamplingParamsError(
                    f"unknown sampling parameter {key!r}; known: {', '.join(sorted(known))}"
                )
            if value is None:
                continue
            if key == "stop":
                value = [value] if isinstance(value, str) else list(value)
                if not all(isinstance(s, str) for s in value):
                    raise SamplingParamsError("stop must be a string or a list of strings")
            elif key in ("max_new_tokens", "top_k", "seed"):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise SamplingParamsError(f"{key} must be an integer, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise SamplingParamsError(f"{key} must be a number, got {value!r}")
            else:
                value = float(value)
            changes[key] = value
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ReplayRequest:
    """The replay data to ask an engine for, with the model shapes to check it by."""

    # Ask for the routed experts of positions from this one on (None: do not ask).
    routed_start: int | None = None
    routing: RoutingShape | None = None
    # Ask for the indexer top-k (of every position) when set.
    indexer: IndexerShape | None = None

    def from_position(self, start: int) -> ReplayRequest:
        """This request with routed experts asked from `start`, if they are asked at all."""
        if self.routed_start is None:
            return self
        return dataclasses.replace(self, routed_start=start)

    def asks_rows(self) -> bool:
        """Whether any replay rows are asked for."""
        return self.routed_start is not None or self.indexer is not None

    def unsupported(self) -> tuple[ReplayRows | None, ReplayRows | None]:
        """What an engine that reports neither answers, `(routed_experts, indexer_topk)`:
        `NOT_SUPPORTED` for what was asked, None for the rest."""
        missing = ReplayRows.missing(ReplayGap.NOT_SUPPORTED)
        return (
            None if self.routed_start is None else missing,
            None if self.indexer is None else missing,
        )


@dataclass
class Generation:
    """One sampled turn: the output ids exactly as sampled (end-of-turn token included when the
    model emitted it) and the logprob of each under the sampling distribution; the replay rows
    asked for (None: not asked) and which weights sampled which tokens; and what attempts the
    engine aborted itself sampled before the one answered (`discarded`, never trained)."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # one of FINISH_REASONS
    prompt_tokens: int
    engine_time_s: float
    routed_experts: ReplayRows | None = None
    indexer_topk: ReplayRows | None = None
    weight_versions: tuple[WeightSpan, ...] = ()
    discarded: tuple[Discarded, ...] = ()

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.logprobs):
            raise EngineOutputError(
                EngineFault.LOGPROB_COUNT,
                f"engine returned {len(self.output_ids)} tokens but {len(self.logprobs)} logprobs",
            )
        if self.finish_reason not in FINISH_REASONS:
            raise EngineOutputError(
                EngineFault.FINISH_REASON, f"unknown finish reason {self.finish_reason!r}"
            )


def token_list(ids: Sequence[int] | npt.NDArray[np.integer]) -> list[int]:
    """Ids as plain ints for a JSON body, from a list or a numpy array."""
    tolist = getattr(ids, "tolist", None)
    return tolist() if tolist is not None else [int(x) for x in ids]


@dataclass
class GenerateRequest:
    """One generation call. `request_id` must be unique per call (retries included): engines
    key aborts on it, and SGLang rejects a duplicate rid."""

    # A list, or a uint32 array (spliced prompts are built as arrays); see `token_list`.
    input_ids: Sequence[int] | npt.NDArray[np.integer]
    sampling: SamplingParams
    session_id: str
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # The prompt messages and tools, for information; only the scripted engine reads them.
    messages: list[Message] = field(default_factory=list)
    tools: list[ToolSchema] | None = None
    # What the output must match (a forced tool call); only engines whose
    # `supports_constraints` is true are sent one.
    constraint: OutputConstraint | None = None
    replay: ReplayRequest = field(default_factory=ReplayRequest)
    # The images whose placeholder tokens `input_ids` holds, in order; only engines whose
    # `supports_images` is true are sent any.
    images: list[ImageInput] = field(default_factory=list)
    # The vision encoder's pad token, whose runs in `input_ids` are those images' tokens, in
    # order (-1: the family takes no images); an engine that places images by position reads it.
    image_pad_id: int = -1


@runtime_checkable
class Engine(Protocol):
    """What the adapter needs from an inference engine.

    An engine that can constrain its output to a regular expression (structured output) says
    so with a true `supports_constraints`; the adapter refuses a forced tool choice on any other
    before generating. One that takes images with a prompt's token ids says so with a true
    `supports_images`; the adapter refuses a prompt with images on any other.
    """

    name: str
    supports_constraints: bool
    supports_images: bool

    async def generate(self, req: GenerateRequest) -> Generation:
        """Sample one turn. Raises `EngineError`; if cancelled, the engine stops the request."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop an in-flight request, best effort; unknown ids are ignored."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


@runtime_checkable
class ServedContext(Protocol):
    """An engine that says how many tokens (prompt and output together) it serves a request:
    vLLM's `max_model_len`, which `--max-model-len` sets below the model's own context. The
    adapter holds prompts and outputs to it rather than to the model's `config.json`."""

    async def served_context(self) -> int:
        """The served context length in tokens (0: the engine does not say). Raises
        `EngineError` when the engine cannot be asked."""
        ...


def routed_from_zero(
    req: GenerateRequest, rows: Any, prompt: int, output: int
) -> ReplayRows | None:
    """The routed experts `req` asks for, out of `rows`: one row per position a forward pass
    fed, from position 0 (an in-process model's, verl's server manager's). None when none were
    asked for; `NOT_SUPPORTED` when the engine gave none."""
    replay = req.replay
    if replay.routed_start is None:
        return None
    if rows is None or replay.routing is None:
        return ReplayRows.missing(ReplayGap.NOT_SUPPORTED)
    start = min(replay.routed_start, prompt)
    return checked_rows(
        Replay.ROUTED_EXPERTS,
        np.asarray(rows)[start : prompt + output - 1],
        start=start,
        prompt_tokens=prompt,
        output_tokens=output,
        shape=replay.routing,
        request_id=req.request_id,
    )
