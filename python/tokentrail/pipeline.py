"""The order of one turn's steps, fixed in one place: translate, restore, then render.

An adapter hands over the messages it translated from the harness's request; what comes back
is what the chat template must render and what the tree must record. Restoring before rendering
is what keeps both the tree and the token prefix aligned with what the model generated.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tokentrail.manager import TrajectoryManager
from tokentrail.tree import MessageKey


class Restore(StrEnum):
    """Where recognized echoes are restored."""

    # Before rendering: the prompt and the tree both see the generated message (the default).
    ON = "on"
    # Only in what the tree records; the prompt is rendered from the harness's bytes. Exists to
    # measure what restoring too late costs (token drift), never to run in production.
    TREE_ONLY = "tree_only"
    # Nowhere: the harness's re-rendered echoes go through as they came.
    OFF = "off"


@dataclass(frozen=True)
class TurnMessages:
    render: list[dict[str, Any]]
    record: list[dict[str, Any]]
    # Routing keys of `record`, computed once for the turn; None when not computed.
    keys: list[MessageKey] | None = None


def prompt_messages_for_turn(
    manager: TrajectoryManager,
    sid: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    restore: Restore | str = Restore.ON,
) -> TurnMessages:
    """Translated messages in; the messages to render and the messages to record out."""
    mode = Restore(restore)
    if mode is Restore.OFF:
        return TurnMessages(list(messages), list(messages))
    restored, keys = manager.restore_keyed(sid, messages, tools)
    if mode is Restore.TREE_ONLY:
        return TurnMessages(list(messages), restored, keys)
    return TurnMessages(restored, restored, keys)
