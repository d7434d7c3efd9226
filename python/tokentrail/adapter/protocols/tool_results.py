"""Tool results matched to the calls they answer, and put back in the order of those calls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tokentrail.errors import RequestError
from tokentrail.messages import Message


class ToolResults:
    """The tool calls of the latest assistant message, and the results that answer them.

    Harnesses send results in the order the tools finished (Claude Code puts errors and fast
    tools first), but a template renders a result after the calls without naming its call
    (Qwen's `<tool_response>` carries no id): results are put back in the order of the calls,
    by id, so each one renders in its call's place. A result whose id matches no open call is
    refused, unless `by_position`, a call without an id is open and the id names none of the
    message's calls: the result answers the first such call (slime's pairing,
    `WireOptions.results_by_position`).
    """

    def __init__(self, *, by_position: bool = False) -> None:
        self.by_position = by_position
        self._position: dict[str, int] = {}
        # The positions of the open calls that have no id, in call order, and the ids of the
        # message's calls (by_position only).
        self._unnamed: list[int] = []
        self._named: frozenset[str] = frozenset()
        self._answered: list[tuple[int, Message]] = []

    def open(self, ids: Sequence[str | None]) -> None:
        """A new assistant message with these call ids (in call order; None: a call without
        one)."""
        self._position = {}
        self._unnamed = []
        for pos, call_id in enumerate(ids):
            if call_id is not None:
                self._position.setdefault(call_id, pos)
            elif self.by_position:
                self._unnamed.append(pos)
        self._named = frozenset(self._position) if self._unnamed else frozenset()
        self._answered = []

    def answer(self, call_id: object, message: Message, where: str, what: str) -> None:
        """A result for `call_id`; refused when no open call has that id (or it was answered)
        and no call without an id is open to take it (`by_position`)."""
        if isinstance(call_id, str) and call_id in self._position:
            self._answered.append((self._position.pop(call_id), message))
        elif self._unnamed and call_id not in self._named:
            self._answered.append((self._unnamed.pop(0), message))
        else:
            raise RequestError(
                f"{where}: {what} for {call_id!r} has no matching tool call in the previous "
                "assistant message"
            )

    def flush(self) -> list[Message]:
        """The results answered since the last flush, in the order of their calls."""
        out = [message for _, message in sorted(self._answered, key=lambda pm: pm[0])]
        self._answered = []
        return out

    def close_all(self) -> None:
        """No call is open any more (a user turn came)."""
        self._position = {}
        self._unnamed = []
        self._named = frozenset()
        self._answered = []

    @property
    def open_calls(self) -> Mapping[str, int]:
        """Each open call's position by id."""
        return self._position

    @property
    def unnamed(self) -> tuple[Sequence[int], frozenset[str]]:
        """The positions of the open calls without an id, and the ids of the other calls of
        their message (`by_position`)."""
        return self._unnamed, self._named

    @property
    def answered(self) -> Sequence[tuple[int, Message]]:
        """The results answered and not yet flushed, with their calls' positions."""
        return self._answered

    def restore(
        self,
        open_calls: Mapping[str, int],
        answered: Sequence[tuple[int, Message]],
        unnamed: tuple[Sequence[int], frozenset[str]] = ((), frozenset()),
    ) -> None:
        """Take the state another instance had (see `open_calls`, `answered`, `unnamed`)."""
        self._position = dict(open_calls)
        self._answered = list(answered)
        self._unnamed, self._named = list(unnamed[0]), unnamed[1]


__all__ = ["ToolResults"]
