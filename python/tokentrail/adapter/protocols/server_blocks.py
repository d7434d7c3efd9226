"""Server-tool and tool-search content blocks (Anthropic) in a history, rendered as plain text:
the harness did not run them and the model cannot call them, but they are part of what the
conversation said."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["SERVER_BLOCK_SUFFIXES", "is_server_block", "server_block_text"]


# Server-side and tool-search content blocks (Anthropic) that arrive in a history: the harness
# did not run them and the model cannot call them, but they are part of what the conversation
# said, so they render as text rather than being refused. Keys that carry no meaning for the
# model (ids, signatures, encrypted payloads, cache control) are left out.
SERVER_BLOCK_SUFFIXES = ("_tool_use", "_tool_result")
_OPAQUE_KEYS = frozenset(
    {"type", "id", "tool_use_id", "cache_control", "citations", "encrypted_content",
     "encrypted_index", "signature", "page_age", "file_id"}
)  # fmt: skip


def is_server_block(kind: object) -> bool:
    """A content block a server tool wrote (`server_tool_use`, `web_search_tool_result`,
    `mcp_tool_use`, ...), or a tool-search block (`tool_reference`, `search_result`)."""
    if not isinstance(kind, str) or kind in ("tool_use", "tool_result"):
        return False
    return kind.endswith(SERVER_BLOCK_SUFFIXES) or kind in ("tool_reference", "search_result")


def server_block_text(block: Mapping[str, Any]) -> str:
    """A server-tool or tool-search block as plain text, the same text every time it is sent.

    `server_tool_use` → `[web_search call: {"query": "x"}]`; a tool result → its type, then the
    titles, urls and texts it holds, one per line; `tool_reference` → `[tool reference: NAME]`.
    """
    kind = str(block.get("type"))
    if kind.endswith("_tool_use"):
        payload = json.dumps(block.get("input", {}), ensure_ascii=False, sort_keys=True)
        return f"[{block.get('name', kind)} call: {payload}]"
    if kind == "tool_reference":
        return f"[tool reference: {block.get('tool_name', '')}]"
    lines = [f"[{kind}]"]
    _flatten(block, lines)
    return "\n".join(lines)


def _flatten(value: object, lines: list[str]) -> None:
    if isinstance(value, str):
        if value:
            lines.append(value)
    elif isinstance(value, bool) or isinstance(value, int | float):
        lines.append(json.dumps(value))
    elif isinstance(value, Mapping):
        for key, sub in value.items():
            if key not in _OPAQUE_KEYS:
                _flatten(sub, lines)
    elif isinstance(value, list):
        for sub in value:
            _flatten(sub, lines)
