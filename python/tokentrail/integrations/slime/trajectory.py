"""slime's `TrajectoryManager` (`slime.agent.trajectory`), backed by tokentrail's.

The same method names, arguments and results: `record_turn` routes a turn into the session's
message tree, `get_trajectory` linearizes and consumes it into slime `Sample`s filled from the
rollout's `base_sample`. By default it decides as slime's does (`drift_policy="slime"`, a short
rewritten answer merged); tokentrail's own choices are one argument away. What slime's manager
cannot say, tokentrail's does: `finish` returns the ledger too, and every sample's metadata
carries the ledger entries of its turns (`metadata["ledger"]`). `_trees` is slime's view of the
session trees, read from tokentrail's (`tree_view`).
"""

from __future__ import annotations

import logging
from typing import Any

from tokentrail.core.backend import load_backend
from tokentrail.errors import LogprobAssertionError
from tokentrail.integrations.slime.sample import to_slime
from tokentrail.integrations.slime.tree_view import TreesView
from tokentrail.kinds import DriftPolicy, RewritePolicy
from tokentrail.messages import Message, ToolSchema
from tokentrail.trajectory.linearize import Trajectory
from tokentrail.trajectory.manager import TrajectoryManager as TrailManager
from tokentrail.trajectory.turn import TurnRecord

logger = logging.getLogger(__name__)

# slime's default `fork_threshold_tokens`.
SLIME_FORK_THRESHOLD = 1024


def slime_manager(
    fork_threshold_tokens: int | None = None,
    *,
    drift_policy: DriftPolicy | str = DriftPolicy.SLIME,
    rewrite_policy: RewritePolicy | str | None = None,
    base: type[TrailManager] = TrailManager,
    **kwargs: Any,
) -> TrailManager:
    """A tokentrail manager deciding as slime's does unless told otherwise: slime's threshold
    (1024 when None), its drift rule, and a short rewritten answer merged into the rewrite
    (slime turns merging off with a threshold of 0)."""
    threshold = SLIME_FORK_THRESHOLD if fork_threshold_tokens is None else fork_threshold_tokens
    if rewrite_policy is None:
        rewrite_policy = RewritePolicy.MERGE if threshold > 0 else RewritePolicy.FORK
    return base(
        fork_threshold_tokens=threshold,
        drift_policy=drift_policy,
        rewrite_policy=rewrite_policy,
        **kwargs,
    )


def slime_samples(trajectory: Trajectory, base_sample: Any) -> list[Any]:
    """The trajectory's samples as slime `Sample`s, each carrying its turns' ledger entries."""
    entries = {t.turn_index: t.to_dict() for t in trajectory.ledger.turns}
    out = []
    for sample in trajectory.samples:
        converted = to_slime(sample, base_sample)
        turns = sample.metadata.get("turns") or []
        converted.metadata["ledger"] = [entries[i] for i in turns if i in entries]
        out.append(converted)
    return out


def _common_prefix_len(a: Any, b: Any, chunk: int = 4096) -> int:
    """slime's helper: how many leading ids two sequences share (`chunk` is slime's scan
    block; the core compares them whole)."""
    return load_backend().common_prefix_len(list(a), list(b))


class TrajectoryManager:
    """slime's `TrajectoryManager` interface over tokentrail's (`.core`)."""

    def __init__(
        self,
        *,
        fork_threshold_tokens: int | None = None,
        drift_policy: DriftPolicy | str = DriftPolicy.SLIME,
        rewrite_policy: RewritePolicy | str | None = None,
        core: TrailManager | None = None,
        **kwargs: Any,
    ) -> None:
        self.core = core or slime_manager(
            fork_threshold_tokens,
            drift_policy=drift_policy,
            rewrite_policy=rewrite_policy,
            **kwargs,
        )

    @property
    def _trees(self) -> TreesView:
        """slime's session trees by sid, a read-only view of tokentrail's (`tree_view`)."""
        return TreesView(self.core)

    def has_session(self, sid: str) -> bool:
        return self.core.has_session(sid)

    def turn_count(self, sid: str) -> int:
        return self.core.turn_count(sid)

    def record_turn(
        self,
        sid: str,
        *,
        turn: TurnRecord,
        prompt_messages: list[Message],
        response_message: Message | None,
        metadata: dict[str, Any] | None = None,
        tools: list[ToolSchema] | None = None,
    ) -> int | None:
        """Route one turn into the session's tree; its turn index. As slime's, a turn without
        prompt messages is skipped with a warning (None), and logprobs that are not one per
        output id raise an error that is also an `AssertionError` (`LogprobAssertionError`)."""
        if not prompt_messages:
            logger.warning("record_turn(sid=%s): empty prompt_messages; skipping", sid)
            return None
        logprobs = turn.output_log_probs
        if logprobs is not None and len(logprobs) and len(logprobs) != len(turn.output_ids):
            raise LogprobAssertionError(
                f"turn.output_log_probs length {len(logprobs)} != "
                f"turn.output_ids length {len(turn.output_ids)}"
            )
        return self.core.record_turn(
            sid,
            turn=turn,
            prompt_messages=prompt_messages,
            response_message=response_message,
            metadata=metadata,
            tools=tools,
        )

    def restore_generated_messages(
        self, sid: str, messages: list[Message], tools: list[ToolSchema] | None = None
    ) -> list[Message]:
        """`messages` with every recognized echo of a generated message replaced by the
        message the model generated (see `tokentrail.trajectory.restore`)."""
        return self.core.restore_generated_messages(sid, messages, tools)

    def finish(
        self,
        sid: str,
        *,
        reward: float = 0.0,
        extra_metadata: dict[str, Any] | None = None,
        max_sample_tokens: int = 0,
    ) -> Trajectory:
        """tokentrail's result: the samples, the ledger and the drift decisions."""
        return self.core.finish(
            sid, reward=reward, extra_metadata=extra_metadata, max_sample_tokens=max_sample_tokens
        )

    def get_trajectory(
        self,
        sid: str,
        *,
        base_sample: Any,
        reward: float = 0.0,
        extra_metadata: dict[str, Any] | None = None,
        max_sample_tokens: int = 0,
    ) -> list[Any]:
        """Linearize and consume the session into slime `Sample`s; `reward` goes in full to
        every sample. A second call for the same sid returns []."""
        trajectory = self.finish(
            sid, reward=reward, extra_metadata=extra_metadata, max_sample_tokens=max_sample_tokens
        )
        return slime_samples(trajectory, base_sample)

    def drop_session(self, sid: str) -> None:
        self.core.drop_session(sid)


__all__ = ["TrajectoryManager", "TurnRecord", "slime_manager", "slime_samples"]
