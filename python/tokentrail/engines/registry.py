"""Engines by name: each engine module registers a factory for its spec scheme.

`create_engine("sglang://127.0.0.1:30000", tokenizer)` looks the scheme up and hands the rest of
the spec to the factory. Built-in engines register when `tokentrail.engines` is imported; the
simulated model registers when `tokentrail.sim` is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tokentrail.engines.base import Engine
from tokentrail.errors import EngineSpecError
from tokentrail.text.tokenizer import LoadedTokenizer

DEFAULT_TIMEOUT_S = 600.0

# A factory gets the spec's address part ("" for a bare name), the tokenizer and the timeout.
Factory = Callable[[str, str, LoadedTokenizer, float], Engine]
_FACTORIES: dict[str, tuple[Factory, str]] = {}

F = TypeVar("F", bound=Factory)


def register_engine(scheme: str, usage: str) -> Callable[[F], F]:
    """Register `factory(spec, address, tokenizer, timeout)` for specs `scheme` or
    `scheme:ADDRESS` / `scheme://ADDRESS`; `usage` is shown when a spec is not understood."""

    def decorate(factory: F) -> F:
        _FACTORIES[scheme] = (factory, usage)
        return factory

    return decorate


def engine_names() -> list[str]:
    return sorted(_FACTORIES)


def create_engine(
    spec: str, tokenizer: LoadedTokenizer, *, timeout: float = DEFAULT_TIMEOUT_S
) -> Engine:
    """Build the engine a spec names: `sglang://HOST:PORT`, `vllm://HOST:PORT`, `scripted`,
    `scripted:FILE`, `simulated` (with `tokentrail.sim` imported), or any registered one."""
    scheme, sep, address = spec.partition(":")
    entry = _FACTORIES.get(scheme)
    if entry is None:
        usages = ", ".join(usage for _, usage in sorted(_FACTORIES.values(), key=lambda e: e[1]))
        raise EngineSpecError(f"unknown engine spec {spec!r}; use {usages}")
    factory, _ = entry
    return factory(spec, address.removeprefix("//") if sep else "", tokenizer, timeout)
