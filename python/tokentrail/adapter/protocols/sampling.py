"""The sampling keys the protocols share (output limit, temperature, top_p, top_k, stop
strings, seed), read from a request body and checked for type, as `SamplingParams` field
names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokentrail.errors import RequestError

__all__ = ["sampling_keys"]


def _number(body: Mapping[str, Any], key: str, integer: bool) -> Any:
    value = body.get(key)
    if value is None:
        return None
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise RequestError(f"{key} must be an int" if integer else f"{key} must be a number")
    return value


def _stops(value: object, key: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise RequestError(f"{key} must be a string or a list of strings")


def sampling_keys(body: Mapping[str, Any], max_key: str, stop_key: str) -> dict[str, Any]:
    """The sampling keys protocols share, read from `body`: the output limit (named
    `max_key`), temperature, top_p, top_k, stop strings (named `stop_key`) and seed."""
    out: dict[str, Any] = {}
    max_tokens = _number(body, max_key, integer=True)
    if max_tokens is not None:
        if max_tokens < 1:
            raise RequestError(f"{max_key} must be >= 1")
        out["max_new_tokens"] = max_tokens
    for key in ("temperature", "top_p"):
        value = _number(body, key, integer=False)
        if value is not None:
            out[key] = float(value)
    top_k = _number(body, "top_k", integer=True)
    if top_k is not None:
        out["top_k"] = top_k
    stops = _stops(body.get(stop_key), stop_key)
    if stops is not None:
        out["stop"] = stops
    seed = _number(body, "seed", integer=True)
    if seed is not None:
        out["seed"] = seed
    return out
