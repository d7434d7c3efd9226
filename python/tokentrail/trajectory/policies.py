"""How a `TrajectoryManager` treats what a harness does to its history: the size of a drift
that forks, how a small one heals, what a rewrite does, whether grammar-forced tokens train.
The defaults its keywords take, and `tokentrail serve`'s flags for them."""

from __future__ import annotations

from dataclasses import dataclass

from tokentrail.kinds import ConstrainedPolicy, DriftPolicy, RewritePolicy, SettingGroup
from tokentrail.setting import setting

HISTORY = SettingGroup.HISTORY


@dataclass(frozen=True)
class ManagerPolicies:
    fork_threshold_tokens: int = setting(
        1024, HISTORY, "a drift longer than this starts a new sample", unit="tokens",
        name="fork_threshold",
    )  # fmt: skip
    drift_policy: DriftPolicy = setting(DriftPolicy.MINIMAL, HISTORY, "how a small drift is healed")
    rewrite_policy: RewritePolicy = setting(
        RewritePolicy.FORK, HISTORY,
        "what a harness's rewrite of a short answer does to the generated turn",
    )  # fmt: skip
    train_constrained: ConstrainedPolicy = setting(
        ConstrainedPolicy.MASK, HISTORY,
        "tokens sampled under a grammar (a forced tool call), whose logprobs are the "
        "grammar's, not the policy's: mask them as `constrained` or train them (yes)",
    )  # fmt: skip


DEFAULT_POLICIES = ManagerPolicies()
