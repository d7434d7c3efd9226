"""Reference of `rust/numbers.rs`: a JSON array of scalars, or of equally long rows of
scalars, parsed flat (an engine's per-token numbers without an object per row).

It takes what `json.loads` reads the same way and nothing else: integers that fit 64 bits,
floats, `true`, `false`, `null`, JSON whitespace. Anything more (a string, a nested array, an
empty row, rows of unequal length, `NaN`, a huge integer, broken syntax) is None.
"""

from __future__ import annotations

import json

__all__ = ["number_array"]

_INT64 = 2**63


def _refuse(_: str) -> object:
    raise ValueError("not a number JSON allows")


def number_array(
    text: bytes,
) -> tuple[int, list[int | float | bool | None], list[type | None]] | None:
    """`(width, values, types)` of the array whose text between its brackets is `text` (width
    0: an array of scalars; else rows of `width` scalars, flat; `types`: the one type of every
    value of each column, None where they differ), or None when it is anything else."""
    try:
        items = json.loads(b"[" + text + b"]", parse_constant=_refuse)
    except (ValueError, RecursionError):
        return None
    rows = bool(items) and isinstance(items[0], list)
    width = len(items[0]) if rows else 0
    if rows and width == 0:
        return None
    values: list[int | float | bool | None] = []
    for item in items:
        if rows:
            if not isinstance(item, list) or len(item) != width:
                return None
            values += item
        else:
            values.append(item)
    for value in values:
        if isinstance(value, list | dict | str):
            return None
        if type(value) is int and not -_INT64 <= value < _INT64:
            return None
    step = max(width, 1)
    types = [set(map(type, values[k::step])) for k in range(min(step, len(values)))]
    return width, values, [kinds.pop() if len(kinds) == 1 else None for kinds in types]
