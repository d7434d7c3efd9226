"""One journaled turn: the record the adapter, migration and tests hand the writer
(`Journal.turn`), and what a reader decodes from a turn event (`format.TurnDecoder`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokentrail.core.discarded import Discarded
from tokentrail.core.ids import Logprobs, TokenIds
from tokentrail.core.routing import ReplayRows, WeightSpan
from tokentrail.kinds import Fallback, History
from tokentrail.messages import Message, ToolSchema


@dataclass(frozen=True)
class JournaledTurn:
    """A generated turn of session `sid`: the conversation it answered (as translated for the
    chat template), its tools, the exact prompt ids the engine saw, what it sampled, and how
    the adapter answered it. Decoded, its ids and logprobs are numpy arrays."""

    sid: str
    translated: list[Message]
    response_message: Message | None
    tools: list[ToolSchema] | None
    prompt_ids: TokenIds
    output_ids: TokenIds
    logprobs: Logprobs | None
    finish_reason: str | None
    ill_formed: bool
    metadata: dict[str, Any]
    history: History | None = None
    fallback: Fallback | None = None
    # What the adapter needs to answer a retry of this turn again (its reply), if recorded.
    answer: dict[str, Any] | None = None
    # It was generated for a retry and replaces the earlier turns of the same prompt.
    supersedes: bool = False
    # What the engine reported beyond ids (MoE routing, indexer top-k, weight versions).
    routed_experts: ReplayRows | None = None
    indexer_topk: ReplayRows | None = None
    weight_versions: tuple[WeightSpan, ...] = ()
    # Attempts the engine aborted itself before the one answered (never trained).
    discarded: tuple[Discarded, ...] = ()
    # The session's sequence number of its event: the journal gives it (0 before that).
    seq: int = 0
