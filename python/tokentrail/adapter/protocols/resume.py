"""Translation that a session's next request can resume: a harness resends the whole
conversation every turn, so only the messages after the last unchanged one are translated again.

A protocol translates a request's message list as a fold: each wire message appends to (or, for
a mid-list `system` note, replaces the last of) the output messages, and updates the open tool
calls and the count of dropped media. `Fold` keeps that state and marks it after every wire
message; a later request whose first `k` wire messages are byte for byte the same (and whose
other translated fields are too) starts from the mark after message `k - 1`. A mark holds the
last output message as it stood then: a later wire message may have replaced it (a note joined
into it), and the resumed translation must not see that. The messages before the last are the
earlier translation's own objects (a fold never replaces any but its last message, and never
changes one in place), the state is a copy. The result equals a full translation of the new
request (`tests/test_resume.py` checks it message for message on generated request sequences,
and `serve --verify-resume` on every request).
"""

from __future__ import annotations

from abc import abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tokentrail.adapter.protocols.base import WireProtocol
from tokentrail.adapter.protocols.content import ContentReader
from tokentrail.adapter.protocols.tool_results import ToolResults
from tokentrail.messages import Conversation, Message

__all__ = ["Fold", "FoldMark", "ResumableProtocol", "Translated"]


@dataclass(frozen=True, slots=True)
class FoldMark:
    """The fold's state right after one wire message."""

    messages: int
    # The last output message then (None when there was none): a later wire message may
    # have replaced it in the output list.
    last: Message | None
    # ToolResults: each open call's position by id, and the results answered but not flushed.
    open_calls: dict[str, int]
    answered: tuple[tuple[int, Message], ...]
    media: Counter[str]
    # What else the protocol's fold holds between wire messages (see `Fold.mark`).
    extra: tuple[Any, ...] = ()
    # ToolResults: the positions of the open calls without an id and the ids of the other
    # calls of their message (`by_position` only).
    unnamed: tuple[tuple[int, ...], frozenset[str]] = ((), frozenset())


@dataclass(frozen=True)
class Translated:
    """A request's conversation and the marks after each of its wire messages (empty when the
    protocol does not resume: nothing is then reused)."""

    conversation: Conversation
    marks: tuple[FoldMark, ...] = ()

    def resumable(self, first_changed: int) -> bool:
        """Whether a request whose wire messages before `first_changed` are these ones can
        resume this translation."""
        return 1 <= first_changed <= len(self.marks)


@dataclass
class Fold:
    """A translation in progress: output messages, open tool calls, media counted."""

    reader: ContentReader
    messages: list[Message] = field(default_factory=list)
    results: ToolResults = field(default_factory=ToolResults)
    marks: list[FoldMark] = field(default_factory=list)
    # The harness's ids of each assistant message's tool calls (`Conversation.call_ids`).
    call_ids: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def note_calls(self, ids: Sequence[str | None]) -> None:
        """The ids the harness sent with the calls of the last message (an assistant one),
        kept when there is one for every call."""
        at = len(self.messages) - 1
        calls = self.messages[at].get("tool_calls") if at >= 0 else None
        named = [i for i in ids if i is not None]
        if named and calls and len(calls) == len(named) == len(ids):
            self.call_ids[at] = tuple(named)
        else:
            self.call_ids.pop(at, None)

    def mark(self, extra: tuple[Any, ...] = ()) -> None:
        """Remember the state after the wire message just translated; `extra` is the rest of
        the protocol's own state (immutable values), which `resume` hands back."""
        self.marks.append(
            FoldMark(
                len(self.messages),
                self.messages[-1] if self.messages else None,
                dict(self.results.open_calls),
                tuple(self.results.answered),
                Counter(self.reader.media),
                extra,
                (tuple(self.results.unnamed[0]), self.results.unnamed[1]),
            )
        )

    def translated(self, tools: Conversation) -> Translated:
        """The fold's messages as a conversation with the tools (and their rules) of `tools`,
        which a resumed translation takes from the previous one unchanged."""
        conversation = Conversation(
            self.messages,
            tools.tools,
            tool_choice=tools.tool_choice,
            forced_tool=tools.forced_tool,
            withheld_tools=tools.withheld_tools,
            dropped_media=dict(self.reader.media),
            image_sources=dict(self.reader.images),
            call_ids=dict(self.call_ids),
        )
        return Translated(conversation, tuple(self.marks))

    def start(
        self, previous: Translated | None, at: int, declare: Callable[[], Conversation]
    ) -> tuple[Conversation, int]:
        """Resume `previous` before wire message `at` when it can, else start from nothing:
        the tools (and their rules) the translation goes on with, from `previous` or from
        `declare`, and the wire message to go on from."""
        if previous is not None and previous.resumable(at):
            self.resume(previous, at)
            return previous.conversation, at
        return declare(), 0

    def resume(self, previous: Translated, at: int) -> None:
        """Take the state `previous` had before wire message `at` (`previous.resumable(at)`):
        its messages up to there as they were then (the same objects) and a copy of the
        rest."""
        mark = previous.marks[at - 1]
        self.messages = []
        if mark.last is not None:
            self.messages = previous.conversation.messages[: mark.messages - 1]
            self.messages.append(mark.last)
        kept = previous.conversation.call_ids
        if kept and max(kept) >= mark.messages:
            kept = {i: ids for i, ids in kept.items() if i < mark.messages}
        self.call_ids = dict(kept)
        self.results.restore(mark.open_calls, mark.answered, mark.unnamed)
        self.reader.media = Counter(mark.media)
        # A superset of the sources the kept messages mark: only marked ones are read.
        self.reader.images = dict(previous.conversation.image_sources)
        self.marks = list(previous.marks[:at])


class ResumableProtocol(WireProtocol):
    """A protocol whose translation of a request's message list can resume a previous one.

    `array_field` holds the wire messages; `context_fields` are the other fields translation
    reads. A request whose context fields and first wire messages are byte for byte the
    previous request's is translated from there on (`translate_from`).
    """

    array_field: ClassVar[str] = "messages"
    context_fields: ClassVar[frozenset[str]]

    @abstractmethod
    def translate_from(
        self, body: dict[str, Any], previous: Translated | None, first_changed: int
    ) -> Translated:
        """`body` translated; when `previous.resumable(first_changed)`, from its mark there
        (the caller has checked that the fields and wire messages before it are unchanged)."""

    def translate(self, body: dict[str, Any]) -> Conversation:
        return self.translate_from(body, None, 0).conversation
