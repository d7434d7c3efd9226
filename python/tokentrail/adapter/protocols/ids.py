"""Ids on the wire: the session a request names as its credential (`bearer`), and the fresh ids
a protocol mints for its replies and tool calls (`mint_id`)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping

__all__ = ["bearer", "mint_id"]


def bearer(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        token = auth[7:].strip()
        return token or None
    return None


def mint_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"
