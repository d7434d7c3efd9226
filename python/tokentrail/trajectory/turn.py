"""What the engine produced for one turn, and the checks that keep bad turns out of a session.

A `TurnRecord` holds the exact prompt ids the engine saw and the ids it sampled, with their
logprobs, and what the engine reported beside them (routed experts, indexer top-k, weight
versions). `validate_turn` normalizes one into compact numpy arrays or raises a named error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tokentrail.core.discarded import Discarded
from tokentrail.core.ids import LogprobArray, Logprobs, TokenArray, TokenIds, as_token_array
from tokentrail.core.routing import ReplayRows, WeightSpan
from tokentrail.errors import LogprobLengthError, ReplayError, TokenIdError
from tokentrail.kinds import Fallback, History, parse_kind


@dataclass
class TurnRecord:
    prompt_ids: TokenIds
    output_ids: TokenIds
    finish_reason: str | None
    output_log_probs: Logprobs | None = field(default_factory=list)
    ill_formed: bool = False
    # How the prompt ids were built; the ledger reports it per turn.
    history: History | None = None
    fallback: Fallback | None = None
    # What the engine reported per token beside the ids (None: not recorded), and which
    # weights sampled which output tokens.
    routed_experts: ReplayRows | None = None
    indexer_topk: ReplayRows | None = None
    weight_versions: Sequence[WeightSpan] = ()
    # Attempts at the turn the engine aborted itself (a weight push's `/pause?mode=abort`)
    # before the one recorded: kept for the ledger, never trained.
    discarded: Sequence[Discarded] = ()


@dataclass(frozen=True)
class CheckedTurn:
    """A validated turn: ids as `uint32` arrays, logprobs as `float32` or None."""

    prompt_ids: TokenArray
    output_ids: TokenArray
    logprobs: LogprobArray | None
    finish_reason: str | None
    ill_formed: bool
    history: History | None = None
    fallback: Fallback | None = None
    routed_experts: ReplayRows | None = None
    indexer_topk: ReplayRows | None = None
    weight_versions: tuple[WeightSpan, ...] = ()
    discarded: tuple[Discarded, ...] = ()


def validate_turn(turn: TurnRecord) -> CheckedTurn:
    if not isinstance(turn, TurnRecord):
        raise TokenIdError(f"turn: expected a TurnRecord, got {type(turn).__name__}")
    prompt = as_token_array(turn.prompt_ids, "prompt_ids")
    output = as_token_array(turn.output_ids, "output_ids")
    lps = turn.output_log_probs
    logprobs = None
    if lps is not None and len(lps):
        try:
            logprobs = np.asarray(lps, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise LogprobLengthError(f"output_log_probs: not a list of floats ({exc})") from None
        if logprobs.ndim != 1 or len(logprobs) != len(output):
            raise LogprobLengthError(
                f"output_log_probs has {len(lps)} entries for {len(output)} output tokens"
            )
    for name in ("routed_experts", "indexer_topk"):
        value = getattr(turn, name)
        if value is not None and not isinstance(value, ReplayRows):
            raise ReplayError(f"{name}: expected ReplayRows or None, got {type(value).__name__}")
    versions = tuple(turn.weight_versions)
    if not all(isinstance(v, WeightSpan) for v in versions):
        raise ReplayError("weight_versions: expected WeightSpans")
    discarded = tuple(turn.discarded)
    if not all(isinstance(d, Discarded) for d in discarded):
        raise ReplayError("discarded: expected Discarded attempts")
    return CheckedTurn(
        prompt,
        output,
        logprobs,
        turn.finish_reason,
        bool(turn.ill_formed),
        None if turn.history is None else parse_kind(History, turn.history, "history mode"),
        None if turn.fallback is None else parse_kind(Fallback, turn.fallback, "fallback"),
        turn.routed_experts,
        turn.indexer_topk,
        versions,
        discarded,
    )


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """A generated turn as the tree holds it: its tokens live in the session's `TurnStore`."""

    id: int
    output_len: int
    finish_reason: str | None
    ill_formed: bool
    # How its prompt ids were built (None: recorded by a caller that did not say).
    history: History | None = None
    fallback: Fallback | None = None
    # Which weights sampled which of its output tokens (none: the engine did not say).
    weight_versions: tuple[WeightSpan, ...] = ()
    # A later generation from the same prompt replaced it (a retry answered fresh).
    superseded: bool = False
    # How often a retried request was answered with this turn's recorded reply.
    retries: int = 0
    # Attempts the engine aborted itself and the engine client generated again (never trained).
    discarded: tuple[Discarded, ...] = ()
