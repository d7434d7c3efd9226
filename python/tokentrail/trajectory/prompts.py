"""A turn's prompt ids: the held tokens of the last generated turn, the template's glue and the
new messages' tokens when the turn can be spliced; else the full render, encoded from the prefix
the session's previous prompt shares with it.

The spliced tail is checked against the full render for the first splice of each shape of new
messages in a session, before the turn goes out; a failed check falls back to the full render
with a named reason (`Fallback`). After that a session's splices are checked every
`verify_every` splices (1: every turn, before it goes out). With `verify_every` above 1 these
periodic checks are deferred (`check_deferred`, which the adapter runs after the reply is sent;
the session's next build runs it first if nobody did), and the period doubles each time one
passes, up to `MAX_VERIFY_EVERY`. A deferred check that fails makes the session's next turn a
full render with that fallback recorded, and the period starts over.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tokentrail.kinds import Fallback, History, Stage
from tokentrail.messages import Message, ToolSchema
from tokentrail.text.families import count_calls
from tokentrail.text.incremental import IncrementalEncoder
from tokentrail.text.object_tokenizer import ObjectTokenizer
from tokentrail.trajectory.session_state import SpliceAnchor
from tokentrail.trajectory.splice import Splicer
from tokentrail.trajectory.timing import TurnTiming
from tokentrail.trajectory.tree import equal_run

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptIds:
    """A turn's prompt ids, how they were built, and how many came from held tokens."""

    ids: npt.NDArray[np.uint32]
    history: History
    fallback: Fallback | None = None
    held: int = 0


# The longest a session's period between splice checks grows to.
MAX_VERIFY_EVERY = 64


@dataclass(frozen=True)
class _Deferred:
    """A splice to check against the full render: the render must end with `suffix`."""

    messages: list[Message]
    tools: list[ToolSchema] | None
    suffix: str


@dataclass
class _SpliceChecks:
    """Per session: splices until the next check, the shapes of new messages already
    checked, a check waiting to run, and the fallback a failed deferred check left."""

    every: int
    due: int = 0
    verified: set[tuple[str, ...]] = field(default_factory=set)
    deferred: _Deferred | None = None
    failed: Fallback | None = None
    # The tool calls of the messages before the last anchor (`count_calls`), and those
    # messages: a next turn that holds the same ones counts only what follows them.
    counted: list[Message] = field(default_factory=list)
    calls: int = 0

    def calls_before(self, messages: list[Message], index: int) -> int:
        """`count_calls(messages[:index])`, counting only what the last count did not see."""
        start = len(self.counted)
        if start > index or equal_run(messages, self.counted, start) < start:
            start, self.calls = 0, 0
        self.calls += count_calls(messages[start:index])
        self.counted = messages[:index]
        return self.calls


class PromptBuilder:
    """Prompt ids for every session of one pipeline (see the module docstring)."""

    def __init__(self, splicer: Splicer, encoder: IncrementalEncoder, verify_every: int) -> None:
        self.splicer = splicer
        self.encoder = encoder
        self.verify_every = max(1, int(verify_every))
        self._checks: dict[str, _SpliceChecks] = {}

    def build(
        self,
        sid: str,
        messages: list[Message],
        tools: list[ToolSchema] | None,
        anchor: SpliceAnchor | None,
        timing: TurnTiming,
    ) -> PromptIds:
        """Spliced onto `anchor`'s tokens (the last generated turn on the messages' path) when
        possible, else a full render. The full render is made only when needed: a render, a
        fallback, or a splice whose tail is checked against it."""
        if anchor is None:
            full = self._render_timed(messages, tools, timing)
            return PromptIds(self.encode(sid, full), History.RENDER)
        checks = self._checks.setdefault(sid, _SpliceChecks(self.verify_every))
        if checks.deferred is not None:
            self.check_deferred(sid)
        if checks.failed is not None:
            # The last splice failed its (deferred) check: this turn is rendered in full.
            fallback, checks.failed = checks.failed, None
            full = self._render_timed(messages, tools, timing)
            return PromptIds(self.encode(sid, full), History.RENDER, fallback)
        new = messages[anchor.index + 1 :]
        shape = tuple(str(m.get("role", "")) for m in new)
        first = shape not in checks.verified
        periodic = checks.due <= 0
        inline = first or (periodic and self.verify_every == 1)
        text = self._render_timed(messages, tools, timing) if inline else None
        spliced = self.splicer.splice(
            held_prompt=anchor.prompt_ids,
            held_output=anchor.output_ids,
            finish_reason=anchor.finish_reason,
            last_assistant=anchor.message,
            new_messages=new,
            tools=tools,
            full_text=text,
            calls_before=checks.calls_before(messages, anchor.index),
            encode=self.encoder.encode_full,
        )
        if spliced.prompt_ids is None:
            assert spliced.fallback is not None
            logger.debug("session %s: splice fell back (%s)", sid, spliced.fallback)
            if text is None:
                text = self._render_timed(messages, tools, timing)
            return PromptIds(self.encode(sid, text), History.RENDER, spliced.fallback)
        if inline:
            checks.verified.add(shape)
            checks.due = checks.every
        elif periodic:
            suffix = spliced.end + spliced.glue + spliced.tail
            checks.deferred = _Deferred(list(messages), tools, suffix)
            checks.due = checks.every
        checks.due -= 1
        held = len(anchor.prompt_ids) + len(anchor.output_ids)
        return PromptIds(spliced.prompt_ids, History.SPLICE, held=held)

    def deferred(self, sid: str) -> bool:
        """Whether a splice check of the session waits to run."""
        checks = self._checks.get(sid)
        return checks is not None and checks.deferred is not None

    def check_deferred(self, sid: str) -> bool | None:
        """Run the session's deferred splice check, if one waits: True when it passed, False
        when it failed (the next turn renders in full), None when there was none."""
        checks = self._checks.get(sid)
        deferred = checks.deferred if checks is not None else None
        if checks is None or deferred is None:
            return None
        checks.deferred = None
        if self.render(deferred.messages, deferred.tools).endswith(deferred.suffix):
            longer = min(MAX_VERIFY_EVERY, checks.every * 2)
            checks.due += longer - checks.every
            checks.every = longer
            return True
        logger.warning("session %s: a spliced prompt differed from the full render", sid)
        checks.failed = Fallback.TAIL_MISMATCH
        checks.every = self.verify_every
        checks.due = 0
        return False

    def _render_timed(
        self, messages: Sequence[Message], tools: Sequence[ToolSchema] | None, timing: TurnTiming
    ) -> str:
        text = self.render(messages, tools)
        timing.lap(Stage.RENDER)
        return text

    def encode(self, sid: str, text: str) -> npt.NDArray[np.uint32]:
        """A full render's ids, from the prefix the session's previous prompt shares with it."""
        return self.encoder.encode(sid, text)

    def render(self, messages: Sequence[Message], tools: Sequence[ToolSchema] | None) -> str:
        """The full prompt text of a conversation, generation prompt included."""
        return self.splicer.render(messages, tools, add_generation_prompt=True)

    def forget(self, sid: str) -> None:
        self.encoder.forget(sid)
        self._checks.pop(sid, None)


class ObjectPrompts:
    """Prompt ids from a tokenizer object's own `apply_chat_template` (`ObjectTokenizer`): the
    reference path, every turn rendered in full in Python; each says so with
    `Fallback.REFERENCE_TOKENIZER`. The same calls as `PromptBuilder`."""

    def __init__(self, tokenizer: ObjectTokenizer) -> None:
        self.tokenizer = tokenizer

    def build(
        self,
        sid: str,
        messages: list[Message],
        tools: list[ToolSchema] | None,
        anchor: SpliceAnchor | None,
        timing: TurnTiming,
    ) -> PromptIds:
        ids = np.asarray(self.tokenizer.render_ids(messages, tools), dtype=np.uint32)
        timing.lap(Stage.RENDER)
        return PromptIds(ids, History.RENDER, Fallback.REFERENCE_TOKENIZER)

    def deferred(self, sid: str) -> bool:
        return False

    def check_deferred(self, sid: str) -> bool | None:
        return None

    def encode(self, sid: str, text: str) -> npt.NDArray[np.uint32]:
        return np.asarray(self.tokenizer.encode(text), dtype=np.uint32)

    def render(self, messages: Sequence[Message], tools: Sequence[ToolSchema] | None) -> str:
        return self.tokenizer.render_chat(messages, tools, add_generation_prompt=True)

    def count(self, messages: Sequence[Message], tools: Sequence[ToolSchema] | None) -> int:
        return len(self.tokenizer.render_ids(messages, tools))

    def forget(self, sid: str) -> None:
        return None
