"""How many trainer steps old the weights that sampled each trained token are, and what a
trainer's `max_staleness` does with tokens older than that.

A sample's `metadata["weight_versions"]` names the weights that sampled each trained stretch
(`{"version", "start", "end", "trained"}`, in `tokens` positions; a turn sampled while weights
were pushed holds stretches of two versions). Staleness needs a version to be a trainer step:
`version_step` reads one (an integer name, and vLLM's `default` for the weights it started with
as step 0, by default). `staleness(sample, step)` is per response position;
`limit_staleness(samples, step, max_staleness)` masks the tokens that are too old
(`MaskReason.STALE`, counted in `metadata["masked"]`) or drops the samples that hold them
(`StalenessPolicy`), and reports what it did.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
import numpy.typing as npt

from tokentrail.errors import PolicyError
from tokentrail.kinds import MaskReason, StalenessPolicy
from tokentrail.trajectory.sample import Sample

# A response position that no stretch of `metadata["weight_versions"]` covers (not trained,
# or sampled by an engine that names no version).
NO_STEP = -1
# vLLM's name for the weights a server started with (SGLang's is "default" too).
INITIAL_VERSION = "default"

VersionStep = Callable[[str], int]


def step_of(version: str) -> int:
    """The trainer step a weight version names: an integer (what the weight push names each
    version), or `default`, the engine's name for the weights it started with, as step 0."""
    if version == INITIAL_VERSION:
        return 0
    try:
        return int(version)
    except ValueError:
        raise PolicyError(
            f"weight version {version!r} is not a trainer step: push weights with integer "
            "versions, or pass version_step to read them"
        ) from None


def token_steps(sample: Sample, version_step: VersionStep = step_of) -> npt.NDArray[np.int64]:
    """Per response position (as `loss_mask`), the trainer step of the weights that sampled
    it; `NO_STEP` where no version is known."""
    steps = np.full(sample.response_length, NO_STEP, dtype=np.int64)
    offset = sample.prompt_length
    for stretch in sample.metadata.get("weight_versions") or ():
        start = max(0, int(stretch["start"]) - offset)
        end = max(start, int(stretch["end"]) - offset)
        steps[start:end] = version_step(str(stretch["version"]))
    return steps


def staleness(
    sample: Sample, step: int, version_step: VersionStep = step_of
) -> npt.NDArray[np.int64]:
    """Per response position, how many steps old its weights are at trainer step `step`
    (`step` minus the token's version); `NO_STEP` where no version is known."""
    steps = token_steps(sample, version_step)
    return np.where(steps == NO_STEP, NO_STEP, step - steps)


class StalenessJson(TypedDict):
    step: int
    max_staleness: int
    policy: str
    trained_by_staleness: dict[str, int]
    tokens_masked: int
    samples_dropped: int
    tokens_dropped: int


@dataclass
class StalenessReport:
    """What `limit_staleness` did to one batch."""

    step: int
    max_staleness: int
    policy: StalenessPolicy
    # Trained tokens (before the policy) by their staleness.
    trained_by_staleness: dict[int, int] = field(default_factory=dict)
    # Trained tokens masked `stale` (MASK), and samples left out with theirs (DROP).
    tokens_masked: int = 0
    samples_dropped: int = 0
    tokens_dropped: int = 0

    def to_dict(self) -> StalenessJson:
        return {
            "step": self.step,
            "max_staleness": self.max_staleness,
            "policy": str(self.policy),
            "trained_by_staleness": {
                str(k): v for k, v in sorted(self.trained_by_staleness.items())
            },
            "tokens_masked": self.tokens_masked,
            "samples_dropped": self.samples_dropped,
            "tokens_dropped": self.tokens_dropped,
        }


def limit_staleness(
    samples: Iterable[Sample],
    step: int,
    max_staleness: int,
    policy: StalenessPolicy = StalenessPolicy.MASK,
    version_step: VersionStep = step_of,
) -> tuple[list[Sample], StalenessReport]:
    """The batch a trainer at step `step` trains: every trained token sampled by weights more
    than `max_staleness` steps old masked `stale` (a copy of the sample; `metadata["masked"]`
    counts them), or, under `StalenessPolicy.DROP`, every sample holding one left out."""
    if max_staleness < 0:
        raise PolicyError(f"max_staleness must be 0 or more, not {max_staleness}")
    policy = StalenessPolicy(policy)
    report = StalenessReport(step, max_staleness, policy)
    kept: list[Sample] = []
    for sample in samples:
        age = staleness(sample, step, version_step)
        trained = sample.loss_mask.astype(bool)
        ages, counts = np.unique(age[trained & (age != NO_STEP)], return_counts=True)
        for a, n in zip(ages.tolist(), counts.tolist(), strict=True):
            report.trained_by_staleness[a] = report.trained_by_staleness.get(a, 0) + n
        stale = trained & (age > max_staleness)
        n_stale = int(stale.sum())
        if not n_stale:
            kept.append(sample)
        elif policy is StalenessPolicy.DROP:
            report.samples_dropped += 1
            report.tokens_dropped += int(trained.sum())
        else:
            report.tokens_masked += n_stale
            kept.append(_masked(sample, stale, n_stale))
    return kept, report


def _masked(sample: Sample, stale: npt.NDArray[np.bool_], n_stale: int) -> Sample:
    mask = sample.loss_mask.copy()
    mask[stale] = 0
    masked = dict(sample.metadata.get("masked") or {})
    masked[str(MaskReason.STALE)] = masked.get(str(MaskReason.STALE), 0) + n_stale
    return dataclasses.replace(
        sample, loss_mask=mask, metadata={**sample.metadata, "masked": masked}
    )
