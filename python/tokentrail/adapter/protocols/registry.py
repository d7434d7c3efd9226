"""The protocols the adapter serves, by name: each registers itself on import
(`register_protocol`), and a path's errors take the shape of the protocol it belongs to
(`protocol_for_path`)."""

from __future__ import annotations

from typing import TypeVar

from tokentrail.adapter.protocols.base import WireProtocol

__all__ = ["protocol_for_path", "protocols", "register_protocol"]


P = TypeVar("P", bound=type[WireProtocol])
_REGISTRY: dict[str, WireProtocol] = {}


def register_protocol(cls: P) -> P:
    """Class decorator: serve this protocol (one instance) on its routes."""
    _REGISTRY[cls.name] = cls()
    return cls


def protocols() -> list[WireProtocol]:
    return list(_REGISTRY.values())


def protocol_for_path(path: str) -> WireProtocol | None:
    """The protocol whose error shape a path's answers use, by the longest matching prefix."""
    best: tuple[int, WireProtocol] | None = None
    for proto in _REGISTRY.values():
        for prefix in proto.path_prefixes:
            if path.startswith(prefix) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), proto)
    return best[1] if best else None
