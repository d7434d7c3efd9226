"""The order of one turn's steps, fixed in one place: translate, restore, then render.

An adapter hands over the messages it translated from the harness's request; what comes back
is what the chat template must render. Restoring before rendering is what keeps both the tree
and the token prefix aligned with what the model generated.
"""

from __future__ import annotations

from typing import Any

from tokentrail.manager import TrajectoryManager


def prompt_messages_for_turn(
    manager: TrajectoryManager,
    sid: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    restore: bool = True,
) -> list[dict[str, Any]]:
    """Translated messages in, the messages to render and record out."""
    if not restore:
        return list(messages)
    return manager.restore_generated_messages(sid, messages, tools)
