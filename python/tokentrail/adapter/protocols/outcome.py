"""A finished turn as a protocol writes it back (`WireProtocol.reply`): the parsed message, its
tool calls' ids, its numbers and, when asked for, its tokens' logprobs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokentrail.messages import Message

__all__ = ["Outcome"]


@dataclass
class Outcome:
    """A finished turn as a protocol writes it back: the parsed message and its numbers."""

    model: str
    message: Message
    # Fresh ids for the message's tool calls, in order (minted by the protocol).
    call_ids: list[str]
    finish_reason: str
    prompt_tokens: int
    output_tokens: int
    # Prompt tokens reused from the session's held prefix (a splice).
    cached_tokens: int = 0
    # Output tokens spent on reasoning.
    reasoning_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    # The reply's id (`WireProtocol.mint_reply_id`) and the request it answers.
    reply_id: str = ""
    body: Mapping[str, Any] = field(default_factory=dict)
    # (text, logprob) of each sampled token of the reply, when the request asked for them
    # (`WireProtocol.wants_logprobs`); None when it did not.
    token_logprobs: list[tuple[str, float]] | None = None
    # Ids of the reply's parts (Responses' output items) by key: a live stream's, already sent.
    item_ids: dict[str, str] = field(default_factory=dict)
