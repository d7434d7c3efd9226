"""Retried requests answered from the record: one generation per prompt, however often asked.

Harnesses resend a request they got no reply to (hermes-agent and Qwen Code resend the same
body after a 5xx or a timeout; Codex resends it after a dropped stream, with its metadata keys
in another order), and a reply can be lost after its turn was journaled (the adapter killed
before the client read it). Such a request translates to the prompt of a recorded turn nothing
was built on yet (`TurnPipeline.unanswered`); by default (`Retry.REPLAY`) it is answered with
that turn's recorded reply, byte for byte, and nothing is generated or recorded again. The
same holds for a duplicate that arrives while the first is still generating: it waits for it.

A harness that wants a fresh sample says so with `X-Tokentrail-Retry: fresh` (or a session or
adapter default of `Retry.FRESH`); the new generation then supersedes the earlier one, which
the ledger masks as `superseded`. An empty answer (no text, no tool call) is never answered
again: a harness asks again because it got one (Qwen Code retries an empty answer with the
same body), so that retry is generated afresh too. The match is on the translated prompt (its
prompt ids and routing path), the protocol and the sampling parameters: a retry that changes
`max_tokens` (Qwen Code does, after a truncated tool call) is a new request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokentrail.engines.base import SamplingParams
from tokentrail.errors import RequestError
from tokentrail.kinds import Retry, parse_kind
from tokentrail.trajectory.pipeline import PreparedTurn

RETRY_HEADER = "X-Tokentrail-Retry"
# Recorded replies a session keeps for retries: retries are of its latest turns.
KEPT_ANSWERS = 8


@dataclass(frozen=True)
class RecordedAnswer:
    """A recorded turn's reply, as a retry of it is answered."""

    turn: int  # the turn's index in its session
    seq: int  # its journal event's session sequence number (0: not journaled)
    protocol: str
    sampling: str
    reply: dict[str, Any]
    # No text and no tool call: not answered again (see the module docstring).
    empty: bool = False

    def journaled(self) -> dict[str, Any]:
        """What the journal keeps of it, with the turn."""
        return {
            "protocol": self.protocol,
            "sampling": self.sampling,
            "reply": self.reply,
            "empty": self.empty,
        }

    @classmethod
    def from_journal(
        cls, turn: int, seq: int, data: Mapping[str, Any] | None
    ) -> RecordedAnswer | None:
        if not data or not {"protocol", "sampling", "reply"} <= set(data):
            return None
        return cls(
            turn,
            seq,
            str(data["protocol"]),
            str(data["sampling"]),
            dict(data["reply"]),
            bool(data.get("empty", False)),
        )


def is_empty(message: Mapping[str, Any]) -> bool:
    """An answer with no text and no tool call (reasoning alone does not count)."""
    content = message.get("content")
    return not message.get("tool_calls") and not (isinstance(content, str) and content.strip())


def sampling_key(sampling: SamplingParams) -> str:
    """The sampling parameters as one comparable string."""
    return json.dumps(dataclasses.asdict(sampling), sort_keys=True, separators=(",", ":"))


def requested_retry(headers: Mapping[str, str]) -> Retry | None:
    """What the request's `X-Tokentrail-Retry` header asks for, if it has one."""
    value = headers.get(RETRY_HEADER)
    if value is None:
        return None
    return parse_kind(Retry, value.strip().lower(), f"{RETRY_HEADER} value", RequestError)


@dataclass(eq=False)
class InFlight:
    """A turn being generated: a duplicate of it waits for its answer."""

    prepared: PreparedTurn
    protocol: str
    sampling: str
    answer: asyncio.Future[RecordedAnswer | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def matches(self, prepared: PreparedTurn, protocol: str, sampling: str) -> bool:
        mine = self.prepared
        return (
            self.protocol == protocol
            and self.sampling == sampling
            and np.array_equal(mine.prompt_ids, prepared.prompt_ids)
            and (mine.keys or mine.record_messages) == (prepared.keys or prepared.record_messages)
        )

    def settle(self, answer: RecordedAnswer | None) -> None:
        if not self.answer.done():
            self.answer.set_result(answer)


class Answers:
    """One session's recent recorded replies and its turns in flight."""

    def __init__(self) -> None:
        self._by_turn: OrderedDict[int, RecordedAnswer] = OrderedDict()
        self._in_flight: list[InFlight] = []

    def remember(self, answer: RecordedAnswer) -> None:
        self._by_turn[answer.turn] = answer
        while len(self._by_turn) > KEPT_ANSWERS:
            self._by_turn.popitem(last=False)

    def find(self, turns: list[int], protocol: str, sampling: str) -> RecordedAnswer | None:
        """The first of `turns` whose reply is kept, was made for this protocol and sampling,
        and is not empty."""
        for turn in turns:
            answer = self._by_turn.get(turn)
            if answer is None or answer.empty:
                continue
            if answer.protocol == protocol and answer.sampling == sampling:
                return answer
        return None

    async def wait_in_flight(
        self, prepared: PreparedTurn, protocol: str, sampling: str
    ) -> RecordedAnswer | None:
        """The answer of an identical turn being generated now, once it is recorded (None:
        there is none, or it failed)."""
        for pending in self._in_flight:
            if pending.matches(prepared, protocol, sampling):
                answer = await asyncio.shield(pending.answer)
                return None if answer is None or answer.empty else answer
        return None

    def start(self, prepared: PreparedTurn, protocol: str, sampling: str) -> InFlight:
        pending = InFlight(prepared, protocol, sampling)
        self._in_flight.append(pending)
        return pending

    def done(self, pending: InFlight, answer: RecordedAnswer | None) -> None:
        pending.settle(answer)
        if pending in self._in_flight:
            self._in_flight.remove(pending)
