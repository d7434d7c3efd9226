"""The rewrite rule: what happens to a short generated answer that the harness rewrote.

Harnesses repair their own transcripts (a verification nudge stripped, consecutive assistant
messages merged): the history then carries a message we never generated where our answer was.
Under `RewritePolicy.MERGE` (upstream) the generated turn is demoted: it keeps its record, its
tokens are masked as `merged_rewrite`, and the rewritten message routes the rest of the prompt.
Under `RewritePolicy.FORK` (the default) nothing merges: the generated turn stays a leaf and
trains as its own sample.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tokentrail.kinds import RewritePolicy
from tokentrail.messages import Message
from tokentrail.trajectory.tree import DemotedTurn, MessageKey, Node

logger = logging.getLogger(__name__)


def merge_rewrite(
    policy: RewritePolicy,
    fork_threshold_tokens: int,
    node: Node,
    messages: Sequence[Message],
    keys: Sequence[MessageKey],
    i: int,
) -> tuple[Node, int]:
    """Where routing goes on after `node`, which matched `messages[:i]` exactly.

    Merges when the next message is an assistant message, `node` has exactly one assistant
    child, and that child is a generated leaf shorter than `fork_threshold_tokens`.
    """
    if policy is RewritePolicy.FORK or fork_threshold_tokens == 0 or i >= len(messages):
        return node, i
    if messages[i].get("role") != "assistant":
        return node, i
    assistants = [c for c in node.children if c.role == "assistant"]
    if len(assistants) != 1:
        return node, i
    (target,) = assistants
    if target.turn is None or target.children:
        return node, i
    if target.turn.output_len >= fork_threshold_tokens:
        return node, i
    target.demote(DemotedTurn(target.turn_index or 0, target.turn, target.message, target.metadata))
    logger.debug("turn %s demoted by a rewrite of its message", target.turn_index)
    target.turn = None
    target.turn_index = None
    target.rekey(messages[i], keys[i])
    return target, i + 1
