"""slime's `Sample`: slime's own class when slime is installed, else one with the same fields.

slime is not on PyPI, so it is imported lazily, on first use, and only here. tokentrail's
samples become slime's as slime's `TrajectoryManager` fills them from the rollout's
`base_sample`: index, group and rollout ids, prompt and label from it; tokens, loss mask,
logprobs, response length, reward, status and metadata from the trajectory.
"""

from __future__ import annotations

import enum
import functools
import importlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokentrail.trajectory.sample import Sample as TrailSample


class SampleStatus(enum.Enum):
    """slime's `Sample.Status`."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class CompatSample:
    """The fields of slime's `slime.utils.types.Sample` that an agent rollout reads or fills,
    with slime's names and defaults (tensors as lists)."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    # As slime's own rollout sets it: int32 `[len(tokens) - 1, layers, top_k]`, not lists.
    rollout_routed_experts: np.ndarray | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    Status = SampleStatus
    status: SampleStatus = SampleStatus.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0


@functools.cache
def sample_class() -> type[Any]:
    """slime's `Sample` class if slime is importable, else `CompatSample`."""
    try:
        types = importlib.import_module("slime.utils.types")
    except ImportError:
        return CompatSample
    return types.Sample


def _cut(sample: TrailSample) -> bool:
    return sample.metadata.get("finish_reason") == "length"


def decimal_logprobs(logprobs: Any) -> list[float]:
    """float32 logprobs as slime's floats: each the shortest decimal its float32 stands for,
    so a logprob an engine gave as -0.4 is -0.4 again, not -0.4000000059604645 (the two are the
    same float32)."""
    values = np.asarray(logprobs, dtype=np.float32)
    return [float(v) for v in values.astype(str).astype(np.float64).tolist()]


def to_slime(sample: TrailSample, base_sample: Any) -> Any:
    """One tokentrail sample as slime's `Sample`, filled from `base_sample` as slime does."""
    cls = sample_class()
    rollout_id = base_sample.rollout_id
    out = cls(
        index=base_sample.index,
        group_index=base_sample.group_index,
        rollout_id=rollout_id if rollout_id is not None else base_sample.index,
        prompt=base_sample.prompt,
        label=base_sample.label,
        tokens=[int(t) for t in sample.tokens],
        response_length=int(sample.response_length),
        loss_mask=[int(m) for m in sample.loss_mask],
        rollout_log_probs=decimal_logprobs(sample.rollout_log_probs),
        reward=sample.reward,
        # slime's overlong status: the sample's last turn was cut by its `max_tokens`
        # (`metadata["length_truncated"]` says whether any of its turns was).
        status=cls.Status.TRUNCATED if _cut(sample) else cls.Status.COMPLETED,
        metadata=dict(sample.metadata),
    )
    if sample.routed_experts is not None:
        # slime's rows are those of the positions fed forward, (len(tokens) - 1, layers,
        # top-k); tokentrail's also hold the last token's (zeros: it was sampled, never fed).
        # An int32 array, as slime's rollout decodes SGLang's: nested lists of a 128K-token
        # sample would be 50M Python ints.
        rows = sample.routed_experts[: len(sample.tokens) - 1]
        out.rollout_routed_experts = np.ascontiguousarray(rows, dtype=np.int32)
    versions = sample.metadata.get("weight_versions")
    if versions:
        out.weight_versions = list(dict.fromkeys(str(v["version"]) for v in versions))
    return out
