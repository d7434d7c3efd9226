"""The one turn pipeline: translate → restore → prompt ids → [engine] → parse → record.

The HTTP adapter, journal recovery and `replay` all run a turn through `TurnPipeline`, so the
order of the steps is fixed in one place: echoes are restored before the conversation is
rendered (that keeps both the tree and the token prefix aligned with what the model generated),
prompt ids are spliced onto the held tokens when possible and rendered otherwise, sampled text
is parsed into a message, and the turn is recorded. Each stage is timed; what a stage reports
(echoes restored, a splice's fallback) comes back in the `PreparedTurn`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tokentrail.errors import PolicyError, RequestError
from tokentrail.kinds import Fallback, History, Restore, Stage
from tokentrail.messages import Conversation, Message, ToolSchema
from tokentrail.text.incremental import IncrementalEncoder
from tokentrail.text.parsing import ParsedOutput, parse_output
from tokentrail.text.tokenizer import LoadedTokenizer
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.splice import Splicer
from tokentrail.trajectory.tree import MessageKey
from tokentrail.trajectory.turn import Logprobs, TokenIds, TurnRecord

logger = logging.getLogger(__name__)

__all__ = [
    "Generated",
    "PreparedTurn",
    "RecordedPrompt",
    "TurnPipeline",
    "TurnMessages",
    "TurnTiming",
]


@dataclass
class TurnTiming:
    """Seconds one turn spent in each stage, and what the engine reported of its own time."""

    stages: dict[Stage, float] = field(default_factory=dict)
    engine_reported: float | None = None
    _mark: float = field(default_factory=time.perf_counter, repr=False)

    def lap(self, stage: Stage) -> None:
        """Charge the time since the previous lap (or since the timing began) to `stage`."""
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + now - self._mark
        self._mark = now

    @property
    def overhead(self) -> float:
        """Seconds spent in the adapter: every stage but the engine's."""
        return sum(v for k, v in self.stages.items() if k is not Stage.ENGINE)


class Generated(Protocol):
    """What an engine sampled for a turn (`engines.Generation` is one)."""

    @property
    def output_ids(self) -> TokenIds: ...
    @property
    def logprobs(self) -> Logprobs | None: ...
    @property
    def finish_reason(self) -> str | None: ...


@dataclass(frozen=True)
class TurnMessages:
    """A conversation after the restore stage."""

    render: list[Message]
    record: list[Message]
    # Routing keys of `record`, computed once for the turn; None when not computed.
    keys: list[MessageKey] | None = None


@dataclass(frozen=True)
class RecordedPrompt:
    """A turn's prompt ids as they were served, for recovery: not rendered again."""

    prompt_ids: TokenIds
    history: History | None = None
    fallback: Fallback | None = None


@dataclass
class PreparedTurn:
    """A turn ready for the engine: its prompt ids and what the stages found on the way."""

    sid: str
    conversation: Conversation
    # What the template rendered and what the tree records (they differ only under
    # `Restore.TREE_ONLY`); `keys` are the routing keys of `record_messages`, when computed.
    messages: list[Message]
    record_messages: list[Message]
    keys: list[MessageKey] | None
    prompt_ids: npt.NDArray[np.uint32]
    history: History
    fallback: Fallback | None
    # Tools of the echoes this turn restored for the first time.
    restored_tools: list[str]
    timing: TurnTiming

    @property
    def tools(self) -> list[ToolSchema] | None:
        return self.conversation.tools


@dataclass
class _SpliceChecks:
    """Per session: splices made, and the shapes of new messages already checked."""

    splices: int = 0
    verified: set[tuple[str, ...]] = field(default_factory=set)


class TurnPipeline:
    """One turn's steps over a manager, a tokenizer and a chat template.

    Without a tokenizer the pipeline replays recorded turns only (`RecordedPrompt`), as an
    audit of a journal does.

    `splice_verify_every`: a spliced tail is checked against the full render for the first
    splice of each shape of new messages in a session, then every this many splices (1: every
    turn); a failed check falls back to the full render with a named reason.
    """

    def __init__(
        self,
        manager: TrajectoryManager,
        tokenizer: LoadedTokenizer | None,
        chat_template: str | None = None,
        *,
        restore: Restore | str = Restore.ON,
        history: History | str = History.SPLICE,
        splice_verify_every: int = 8,
        tool_parser: str | None = "hermes",
        reasoning_parser: str | None = "qwen3",
    ) -> None:
        self.manager = manager
        self._tokenizer = tokenizer
        self.chat_template = chat_template or (tokenizer.chat_template if tokenizer else "")
        self.restore = Restore(restore)
        self.history = History(history)
        self.splice_verify_every = max(1, int(splice_verify_every))
        self.tool_parser = tool_parser
        self.reasoning_parser = reasoning_parser
        self._splicer = Splicer(tokenizer, self.chat_template) if tokenizer else None
        # Full renders (first turns, render history, fallbacks) reuse the ids of the prefix a
        # session's previous prompt shares with them.
        self._encoder = IncrementalEncoder(tokenizer) if tokenizer else None
        self._checks: dict[str, _SpliceChecks] = {}

    @property
    def tokenizer(self) -> LoadedTokenizer:
        if self._tokenizer is None:
            raise PolicyError("this pipeline has no tokenizer: it replays recorded turns only")
        return self._tokenizer

    @property
    def splicer(self) -> Splicer:
        if self._splicer is None:
            raise PolicyError("this pipeline has no tokenizer: it replays recorded turns only")
        return self._splicer

    # -- before the engine ----------------------------------------------------------------------

    def prepare(
        self,
        sid: str,
        conversation: Conversation,
        *,
        history: History | None = None,
        recorded: RecordedPrompt | None = None,
        timing: TurnTiming | None = None,
    ) -> PreparedTurn:
        """Restore the conversation's echoes and build its prompt ids.

        `history` overrides the pipeline's for this turn; `recorded` gives the prompt ids a
        journal holds (recovery), which are then used as they are. Raises `RequestError` for a
        conversation with nothing to render, and `TemplateError` when the template refuses it.
        """
        timing = timing or TurnTiming()
        if not conversation.messages:
            raise RequestError("the request has no messages to render")
        restored_before = self.manager.restored_by_tool(sid)
        restored = self.restored(sid, conversation)
        render_messages, record_messages, keys = restored.render, restored.record, restored.keys
        restored_tools = [
            tool
            for tool, n in self.manager.restored_by_tool(sid).items()
            for _ in range(n - restored_before.get(tool, 0))
        ]
        timing.lap(Stage.RESTORE)
        if recorded is not None:
            ids = np.asarray(recorded.prompt_ids, dtype=np.uint32)
            used = recorded.history or History.RENDER
            fallback = recorded.fallback
        else:
            ids, used, fallback = self._prompt_ids(
                sid,
                render_messages,
                conversation.tools,
                history or self.history,
                keys if render_messages is record_messages else None,
                timing,
            )
        timing.lap(Stage.TOKENIZE)
        return PreparedTurn(
            sid,
            conversation,
            render_messages,
            record_messages,
            keys,
            ids,
            used,
            fallback,
            restored_tools,
            timing,
        )

    def restored(self, sid: str, conversation: Conversation) -> TurnMessages:
        """The restore stage alone: what the template renders and what the tree records."""
        messages = conversation.messages
        if self.restore is Restore.OFF:
            return TurnMessages(list(messages), list(messages))
        restored, keys = self.manager.restore_keyed(sid, messages, conversation.tools)
        if self.restore is Restore.TREE_ONLY:
            return TurnMessages(list(messages), restored, keys)
        return TurnMessages(restored, restored, keys)

    def _prompt_ids(
        self,
        sid: str,
        messages: list[Message],
        tools: list[ToolSchema] | None,
        history: History,
        keys: list[MessageKey] | None,
        timing: TurnTiming,
    ) -> tuple[npt.NDArray[np.uint32], History, Fallback | None]:
        """Spliced onto the last generated turn's tokens when possible, else a full render.

        The full render is made only when needed: a render, a fallback, or a splice whose tail
        is checked against it.
        """
        anchor = (
            self.manager.splice_anchor(sid, messages, keys) if history is History.SPLICE else None
        )
        if anchor is None:
            return (
                self._encode(sid, self._render_timed(messages, tools, timing)),
                History.RENDER,
                None,
            )
        new = messages[anchor.index + 1 :]
        checks = self._checks.setdefault(sid, _SpliceChecks())
        shape = tuple(str(m.get("role", "")) for m in new)
        verify = shape not in checks.verified or checks.splices % self.splice_verify_every == 0
        text = self._render_timed(messages, tools, timing) if verify else None
        spliced = self.splicer.splice(
            held_prompt=anchor.prompt_ids,
            held_output=anchor.output_ids,
            finish_reason=anchor.finish_reason,
            last_assistant=anchor.message,
            new_messages=new,
            tools=tools,
            full_text=text,
        )
        if spliced.prompt_ids is None:
            assert spliced.fallback is not None
            logger.debug("session %s: splice fell back (%s)", sid, spliced.fallback)
            if text is None:
                text = self._render_timed(messages, tools, timing)
            return self._encode(sid, text), History.RENDER, spliced.fallback
        checks.splices += 1
        if verify:
            checks.verified.add(shape)
        return spliced.prompt_ids, History.SPLICE, None

    def _render_timed(
        self, messages: Sequence[Message], tools: Sequence[ToolSchema] | None, timing: TurnTiming
    ) -> str:
        text = self.render(messages, tools)
        timing.lap(Stage.RENDER)
        return text

    def _encode(self, sid: str, text: str) -> npt.NDArray[np.uint32]:
        if self._encoder is None:
            raise PolicyError("this pipeline has no tokenizer: it replays recorded turns only")
        return self._encoder.encode(sid, text)

    def render(self, messages: Sequence[Message], tools: Sequence[ToolSchema] | None) -> str:
        """The full prompt text of a conversation, generation prompt included."""
        return self.splicer.render(messages, tools, add_generation_prompt=True)

    def count_tokens(self, conversation: Conversation) -> int:
        """How many tokens the conversation's full render has (nothing is recorded)."""
        if not conversation.messages:
            raise RequestError("the request has no messages to render")
        return len(self.tokenizer.encode(self.render(conversation.messages, conversation.tools)))

    def unanswered(self, prepared: PreparedTurn) -> list[int]:
        """Recorded turns this prepared turn would retry (same prompt, nothing built on them),
        latest first; see `TrajectoryManager.unanswered_turns`."""
        return self.manager.unanswered_turns(
            prepared.sid, prepared.record_messages, prepared.prompt_ids, prepared.keys
        )

    # -- after the engine -----------------------------------------------------------------------

    def parse(self, prepared: PreparedTurn, output_ids: TokenIds) -> ParsedOutput:
        """The assistant message in the sampled ids; the end-of-turn token is the engine's
        stop, not part of the message."""
        ids = [int(x) for x in output_ids]
        end = len(ids)
        while end and ids[end - 1] in self.tokenizer.end_token_ids:
            end -= 1
        parsed = parse_output(
            self.tokenizer.decode(ids[:end]),
            tool_parser=self.tool_parser,
            reasoning_parser=self.reasoning_parser,
            tools=prepared.tools,
        )
        prepared.timing.lap(Stage.PARSE)
        return parsed

    def record(
        self,
        prepared: PreparedTurn,
        generated: Generated,
        response: Message | None,
        *,
        ill_formed: bool = False,
        metadata: dict[str, Any] | None = None,
        supersede: bool = False,
    ) -> int:
        """Record the turn in the session's tree; returns its turn index. With `supersede` it
        replaces the turns it retries (`unanswered`)."""
        index = self.manager.record_turn(
            prepared.sid,
            turn=TurnRecord(
                prepared.prompt_ids,
                generated.output_ids,
                generated.finish_reason,
                generated.logprobs,
                ill_formed=ill_formed,
                history=prepared.history,
                fallback=prepared.fallback,
            ),
            prompt_messages=prepared.record_messages,
            response_message=response,
            tools=prepared.tools,
            metadata=metadata,
            keys=prepared.keys,
            supersede=supersede,
        )
        prepared.timing.lap(Stage.RECORD)
        return index

    def forget(self, sid: str) -> None:
        """Drop what the pipeline keeps for a session (its encoder state, splice checks)."""
        if self._encoder is not None:
            self._encoder.forget(sid)
        self._checks.pop(sid, None)
