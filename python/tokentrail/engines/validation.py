"""What an engine's answer must be before any of it is parsed, answered or trained on.

An engine is a separate process that can be buggy, misconfigured or (behind a router) not the
one expected. `check_generation` holds a `Generation` to the request that asked for it: every
id inside the tokenizer's vocabulary, one finite logprob <= 0 per token, no more tokens than
`max_new_tokens` (plus one end-of-turn token), at least one token, a known finish reason. A
violation is an `EngineOutputError` naming its `EngineFault`.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from tokentrail.core.ids import INTS, NUMBERS, only_types
from tokentrail.engines.base import FINISH_REASONS, Generation
from tokentrail.errors import EngineOutputError
from tokentrail.kinds import EngineFault

__all__ = ["CHECK_INLINE_TOKENS", "check_generation"]

# Up to this many tokens a check takes well under a millisecond; a longer generation's walk
# over every id and logprob belongs off the event loop.
CHECK_INLINE_TOKENS = 4096


def check_generation(
    generation: Generation,
    *,
    max_new_tokens: int,
    vocab_size: int,
    end_token_ids: Collection[int] = (),
) -> None:
    """Refuse a generation that cannot be what the engine sampled for this request."""
    ids = generation.output_ids
    n = len(ids)
    if generation.finish_reason not in FINISH_REASONS:
        raise EngineOutputError(
            EngineFault.FINISH_REASON,
            f"unknown finish reason {generation.finish_reason!r}; expected one of {FINISH_REASONS}",
        )
    if n == 0:
        raise EngineOutputError(EngineFault.EMPTY, "the engine returned no tokens")
    if len(generation.logprobs) != n:
        raise EngineOutputError(
            EngineFault.LOGPROB_COUNT,
            f"the engine returned {n} tokens but {len(generation.logprobs)} logprobs",
        )
    # The end-of-turn token may come on top of the budget (engines differ in counting it).
    allowed = max_new_tokens + (1 if ids[-1] in end_token_ids else 0)
    if n > allowed:
        raise EngineOutputError(
            EngineFault.TOO_LONG,
            f"the engine returned {n} tokens for a request of at most {max_new_tokens}",
        )
    array = _as_array(ids, np.int64)
    if array is None:
        bad = next((t for t in ids if type(t) is not int and not isinstance(t, np.integer)), None)
        what = f"token id {bad!r} is not an integer" if bad is not None else "a token id is huge"
        raise EngineOutputError(EngineFault.TOKEN_ID, what)
    outside = np.flatnonzero((array < 0) | (array >= vocab_size))
    if len(outside):
        at = int(outside[0])
        raise EngineOutputError(
            EngineFault.TOKEN_ID,
            f"token id {int(array[at])} at position {at} is outside the vocabulary "
            f"(0..{vocab_size - 1})",
        )
    logprobs = _as_array(generation.logprobs, np.float64)
    if logprobs is None:
        raise EngineOutputError(EngineFault.LOGPROB, "a logprob is not a number")
    wrong = np.flatnonzero(~np.isfinite(logprobs) | (logprobs > 0.0))
    if len(wrong):
        at = int(wrong[0])
        raise EngineOutputError(
            EngineFault.LOGPROB,
            f"logprob {float(logprobs[at])!r} at position {at} is not a finite number <= 0",
        )


def _as_array(values: object, dtype: type[np.generic]) -> np.ndarray | None:
    """`values` as a 1-D array of `dtype`, or None when one of them is not such a number
    (a string, a bool, an integer past 64 bits, a float among ids)."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in ("iu" if dtype is np.int64 else "iuf"):
            return None
        return values.astype(dtype, copy=False)
    items = list(values)  # type: ignore[call-overload]
    if dtype is np.int64:
        ok = only_types(items, INTS) or all(
            type(t) is int or isinstance(t, np.integer) for t in items
        )
    else:
        ok = only_types(items, NUMBERS) or all(
            type(t) in (int, float) or isinstance(t, np.floating | np.integer) for t in items
        )
    if not ok:
        return None
    try:
        return np.asarray(items, dtype=dtype)
    except OverflowError:
        return None
