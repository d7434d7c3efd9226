"""Token ids: their type, and one check for every caller. The reference core, `TurnRecord`
validation and the exporters all refuse a bad id with the same named error."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from tokentrail.errors import TokenIdError

# Token ids and their logprobs as the package takes them: lists, or numpy arrays (what it
# hands back once it has checked or stored them).
TokenIds = Sequence[int] | npt.NDArray[np.integer]
Logprobs = Sequence[float] | npt.NDArray[np.floating]

# The arrays it hands back, as the core's stub types them: ids, their logprobs, a loss mask
# (or a per-token status code), and replay rows (`[tokens, layers, k]`, their own type).
TokenArray = npt.NDArray[np.uint32]
LogprobArray = npt.NDArray[np.float32]
MaskArray = npt.NDArray[np.uint8]
RowArray = npt.NDArray[np.integer]

_MAX_TOKEN_ID = 2**32 - 1


def only_types(items: Iterable[object], types: frozenset[type]) -> bool:
    """Whether every item's type is exactly one of `types`: one pass in C (`map(type, ..)`),
    where a generator over a long turn's ids would run the interpreter once per token."""
    return set(map(type, items)) <= types


INTS = frozenset({int})
NUMBERS = frozenset({int, float})


def as_token_array(ids: object, what: str) -> TokenArray:
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
    if only_types(ids, INTS):
        # Plain ints (a turn's ids as parsed): checked in C; a bad one is named below.
        try:
            array = np.asarray(ids, dtype=np.int64)
        except OverflowError:
            array = None
        if array is not None and not (
            array.size and (int(array.min()) < 0 or int(array.max()) > _MAX_TOKEN_ID)
        ):
            return array.astype(np.uint32)
    for pos, x in enumerate(ids):
        if isinstance(x, bool) or not isinstance(x, int | np.integer):
            raise TokenIdError(f"{what}[{pos}]: expected an int, got {type(x).__name__}")
        if x < 0 or x > _MAX_TOKEN_ID:
            raise TokenIdError(f"{what}[{pos}]: id {x} is outside [0, 2**32)")
    return np.asarray(ids, dtype=np.uint32)
