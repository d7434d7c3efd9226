"""What the engine produced for one turn, and the checks that keep bad turns out of a session.

A `TurnRecord` holds the exact prompt ids the engine saw and the ids it sampled, with their
logprobs. `validate_turn` normalizes one into compact numpy arrays or raises a named error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tokentrail.errors import LogprobLengthError, TokenIdError

_MAX_TOKEN_ID = 2**32 - 1


@dataclass
class TurnRecord:
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    finish_reason: str | None
    output_log_probs: Sequence[float] = field(default_factory=list)
    ill_formed: bool = False


def as_token_array(ids: object, what: str) -> np.ndarray:
    """Check a token sequence and return it as a `uint32` array (no copy when it already is)."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise TokenIdError(f"{what}: expected a 1-D integer array, got {ids.dtype}{ids.shape}")
        if ids.dtype == np.uint32:
            return ids
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) > _MAX_TOKEN_ID):
            raise TokenIdError(f"{what}: ids must lie in [0, 2**32)")
        return ids.astype(np.uint32)
    if not isinstance(ids, list | tuple):
        raise TokenIdError(f"{what}: expected a list of ints, got {type(ids).__name__}")
    for pos, x in enumerate(ids):
        if isinstance(x, bool) or not isinstance(x, int | np.integer):
            raise TokenIdError(f"{what}[{pos}]: expected an int, got {type(x).__name__}")
        if x < 0 or x > _MAX_TOKEN_ID:
            raise TokenIdError(f"{what}[{pos}]: id {x} is outside [0, 2**32)")
    return np.asarray(ids, dtype=np.uint32)


@dataclass(frozen=True)
class CheckedTurn:
    """A validated turn: ids as `uint32` arrays, logprobs as `float32` or None."""

    prompt_ids: np.ndarray
    output_ids: np.ndarray
    logprobs: np.ndarray | None
    finish_reason: str | None
    ill_formed: bool


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
    return CheckedTurn(prompt, output, logprobs, turn.finish_reason, bool(turn.ill_formed))


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """A generated turn as the tree holds it: its tokens live in the session's `TurnStore`."""

    id: int
    output_len: int
    finish_reason: str | None
    ill_formed: bool
