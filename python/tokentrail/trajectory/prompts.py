"""A turn's prompt ids: the held tokens of the last generated turn, the template's glue and the
new messages' tokens when the turn can be spliced; else the full render, encoded from the prefix
the session's previous prompt shares with it.

The spliced tail is checked against the full render for the first splice of each shape of new
messages in a session, then every `verify_every` splices (1: every turn); a failed check falls
back to the full render with a named reason (`Fallback`).
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
from tokentrail.trajectory.manager import SpliceAnchor
from tokentrail.trajectory.splice import Splicer
from tokentrail.trajectory.timing import TurnTiming

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptIds:
    """A turn's prompt ids, how they were built, and how many came from held tokens."""

    ids: npt.NDArray[np.uint32]
    history: History
    fallback: Fallback | None = None
    held: int = 0


@dataclass
class _SpliceChecks:
    """Per session: splices made, and the shapes of new messages already checked."""

    splices: int = 0
    verified: set[tuple[str, ...]] = field(default_factory=set)


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
        new = messages[anchor.index + 1 :]
        checks = self._checks.setdefault(sid, _SpliceChecks())
        shape = tuple(str(m.get("role", "")) for m in new)
        verify = shape not in checks.verified or checks.splices % self.verify_every == 0
        text = self._render_timed(messages, tools, timing) if verify else None
        spliced = self.splicer.splice(
            held_prompt=anchor.prompt_ids,
            held_output=anchor.output_ids,
            finish_reason=anchor.finish_reason,
            last_assistant=anchor.message,
            new_messages=new,
            tools=tools,
            full_text=text,
            calls_before=count_calls(messages[: anchor.index]),
        )
        if spliced.prompt_ids is None:
            assert spliced.fallback is not None
            logger.debug("session %s: splice fell back (%s)", sid, spliced.fallback)
            if text is None:
                text = self._render_timed(messages, tools, timing)
            return PromptIds(self.encode(sid, text), History.RENDER, spliced.fallback)
        checks.splices += 1
        if verify:
            checks.verified.add(shape)
        held = len(anchor.prompt_ids) + len(anchor.output_ids)
        return PromptIds(spliced.prompt_ids, History.SPLICE, held=held)

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
