"""A trainer's `max_staleness` over the per-token weight versions a sample carries: how old each
trained token's weights are at a trainer step, the tokens too old masked `stale` (or their
samples dropped), and a report that adds up."""

from __future__ import annotations

import numpy as np
import pytest

from tokentrail.errors import PolicyError
from tokentrail.kinds import MaskReason, StalenessPolicy
from tokentrail.trajectory.sample import Sample
from tokentrail.trajectory.staleness import NO_STEP, limit_staleness, staleness, token_steps

PROMPT = 4


def sample(stretches: list[tuple[str, int, int]], response: int = 10) -> Sample:
    """A sample with a `PROMPT`-token prompt and `response` tokens, trained where a stretch
    (version, start, end in response positions) covers them."""
    mask = np.zeros(response, dtype=np.int32)
    versions = []
    for version, start, end in stretches:
        mask[start:end] = 1
        versions.append(
            {
                "version": version,
                "start": PROMPT + start,
                "end": PROMPT + end,
                "trained": end - start,
            }
        )
    return Sample(
        tokens=np.arange(PROMPT + response, dtype=np.int64),
        loss_mask=mask,
        rollout_log_probs=np.where(mask == 1, -1.0, 0.0).astype(np.float32),
        response_length=response,
        metadata={"weight_versions": versions},
    )


def test_each_token_is_as_old_as_the_weights_that_sampled_it() -> None:
    # A turn sampled across a push (versions 1 then 2 back to back), then a turn under 3.
    s = sample([("1", 0, 3), ("2", 3, 5), ("3", 7, 10)])
    assert token_steps(s).tolist() == [1, 1, 1, 2, 2, NO_STEP, NO_STEP, 3, 3, 3]
    assert staleness(s, 3).tolist() == [2, 2, 2, 1, 1, NO_STEP, NO_STEP, 0, 0, 0]


def test_the_engines_initial_weights_are_step_zero() -> None:
    assert token_steps(sample([("default", 0, 2)]))[:2].tolist() == [0, 0]


def test_tokens_older_than_max_staleness_are_masked_stale() -> None:
    s = sample([("1", 0, 3), ("2", 3, 5), ("3", 7, 10)])
    (kept,), report = limit_staleness([s], step=3, max_staleness=1)
    assert kept.loss_mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    assert kept.metadata["masked"] == {str(MaskReason.STALE): 3}
    # The input is left as it was: a trainer may apply another policy to the same batch.
    assert s.loss_mask.tolist() == [1, 1, 1, 1, 1, 0, 0, 1, 1, 1]
    assert report.trained_by_staleness == {0: 3, 1: 2, 2: 3}
    assert report.tokens_masked == 3 and report.samples_dropped == 0
    assert report.to_dict()["trained_by_staleness"] == {"0": 3, "1": 2, "2": 3}


def test_drop_leaves_out_every_sample_holding_a_stale_token() -> None:
    fresh, old = sample([("3", 0, 4)]), sample([("1", 0, 2), ("3", 2, 4)])
    kept, report = limit_staleness([fresh, old], 3, 1, StalenessPolicy.DROP)
    assert kept == [fresh]
    assert (report.samples_dropped, report.tokens_dropped, report.tokens_masked) == (1, 4, 0)


def test_within_the_limit_nothing_changes() -> None:
    s = sample([("2", 0, 4)])
    (kept,), report = limit_staleness([s], 3, 1)
    assert kept is s and report.tokens_masked == 0


def test_versions_that_are_not_steps_and_negative_limits_are_refused() -> None:
    with pytest.raises(PolicyError, match="not a trainer step"):
        token_steps(sample([("step-7", 0, 2)]))
    assert token_steps(sample([("step-7", 0, 2)]), lambda v: int(v.split("-")[1]))[0] == 7
    with pytest.raises(PolicyError, match="max_staleness"):
        limit_staleness([], 3, -1)
