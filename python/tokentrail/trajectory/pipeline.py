"""The one turn pipeline: translate → restore → prompt ids → [engine] → parse → record.

The HTTP adapter, journal recovery and `replay` all run a turn through `TurnPipeline`, so the
order of the steps is fixed in one place: a trailing assistant prefill is split off, echoes are
restored before the conversation is rendered (that keeps both the tree and the token prefix
aligned with what the model generated), prompt ids are spliced onto the held tokens when
possible and rendered otherwise, sampled text is parsed into a message, and the turn is
recorded. Each stage is timed; what a stage reports (echoes restored, a splice's fallback, an
exclusion, what translation dropped) comes back in the `PreparedTurn`.

A conversation with nothing to record (no message before the prefill) is refused before the
engine runs: the engine is called only for a turn that will be recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tokentrail.core.discarded import Discarded
from tokentrail.core.ids import Logprobs, TokenIds
from tokentrail.core.routing import ReplayRows, WeightSpan
from tokentrail.errors import PolicyError, RequestError
from tokentrail.kinds import Fallback, History, Restore, Stage, ToolChoice, parse_kind
from tokentrail.messages import Conversation, Message, ToolSchema
from tokentrail.text.constraints import OutputConstraint, forced_tool_call
from tokentrail.text.families import Family, resolve_family
from tokentrail.text.hf import HFTokenizer, as_loaded
from tokentrail.text.incremental import IncrementalEncoder
from tokentrail.text.object_tokenizer import ObjectTokenizer
from tokentrail.text.parsing import ParsedOutput, parse_output
from tokentrail.text.template_check import check_within_budget
from tokentrail.text.tokenizer import LoadedTokenizer
from tokentrail.text.vision import VisionSpec, image_positions, vision_spec
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.prefill import Prefill, continuation, prefill_text, split_prefill
from tokentrail.trajectory.prompts import ObjectPrompts, PromptBuilder
from tokentrail.trajectory.side import SideRules, exclusion
from tokentrail.trajectory.splice import Splicer
from tokentrail.trajectory.tags import TurnTags
from tokentrail.trajectory.timing import TurnTiming
from tokentrail.trajectory.tree import MessageKey
from tokentrail.trajectory.turn import TurnRecord

logger = logging.getLogger(__name__)

__all__ = [
    "Generated",
    "ParsedTurn",
    "PreparedTurn",
    "RecordedPrompt",
    "TurnPipeline",
    "TurnMessages",
    "TurnTiming",
    "reasoning_tokens",
]

# A parser argument that means "the family's": the tokenizer's, or the one the template matches.
AUTO = "auto"
# The prompt's last tokens a forced call's constraint reads (an opened or closed `<think>`).
PROMPT_END_TOKENS = 8


class Generated(Protocol):
    """What an engine sampled for a turn (`engines.Generation` and a journaled turn are one):
    its tokens, and the replay rows and weight versions it was sampled with."""

    @property
    def output_ids(self) -> TokenIds: ...
    @property
    def logprobs(self) -> Logprobs | None: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def routed_experts(self) -> ReplayRows | None: ...
    @property
    def indexer_topk(self) -> ReplayRows | None: ...
    @property
    def weight_versions(self) -> Sequence[WeightSpan]: ...
    @property
    def discarded(self) -> Sequence[Discarded]: ...


@dataclass(frozen=True)
class TurnMessages:
    """A conversation after the restore stage."""

    render: list[Message]
    record: list[Message]
    # Routing keys of `record`, computed once for the turn; None when not computed.
    keys: list[MessageKey] | None = None
    # The call ids of the echoes first restored by identity, by message index.
    echo_ids: dict[int, tuple[str, ...]] = field(default_factory=dict)


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
    # Prompt tokens taken from the session's held tokens (a splice), not encoded anew.
    held_tokens: int = 0
    # The partial assistant message the model continues (None: a new assistant turn).
    prefill: Prefill | None = None
    # What the engine must sample (a forced tool call), when the request forces one.
    constraint: OutputConstraint | None = None
    # Why the turn is excluded from training (`side.exclusion`); None when it trains.
    excluded: str | None = None
    # Where the engine should start reporting replay rows: the positions before it are rows
    # the session's earlier turns hold (0 when the manager keeps no replay tape).
    replay_start: int = 0
    # The id of the vision encoder's pad token (-1: the family takes no images).
    image_pad_id: int = -1
    # The call ids of the echoes this turn first restored by identity, by message index.
    echo_ids: dict[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def tools(self) -> list[ToolSchema] | None:
        return self.conversation.tools

    def image_tags(self) -> list[dict[str, Any]]:
        """Each image of the prompt, in order: its description (digest, size, processor grid),
        where its placeholder tokens start in `prompt_ids` (`offset`), and its bytes (base64
        `data`). Raises `RequestError` when the prompt's image tokens are not its images'."""
        images = self.conversation.images
        runs = image_positions(self.prompt_ids.tolist(), self.image_pad_id)
        if len(runs) != len(images) or any(
            n != i.tokens for (_, n), i in zip(runs, images, strict=True)
        ):
            raise RequestError(
                f"the prompt holds {len(runs)} image token runs for {len(images)} images: "
                "image tokens in the request's text are not taken"
            )
        return [
            {**i.described(), "offset": at, "data": i.base64_data}
            for (at, _), i in zip(runs, images, strict=True)
        ]

    @property
    def tags(self) -> TurnTags:
        """What the turn's record keeps about it beyond its tokens: its exclusion, the tools
        withheld and the media dropped by translation, a non-default tool choice, a prefill."""
        c = self.conversation
        forced = c.tool_choice is not ToolChoice.AUTO
        return TurnTags(
            excluded=self.excluded,
            withheld_tools=tuple(c.withheld_tools),
            dropped_media=dict(c.dropped_media),
            tool_choice=c.tool_choice.value if forced else None,
            forced_tool=c.forced_tool if forced else None,
            prefill=self.prefill is not None,
            constrained=self.constraint is not None,
            images=tuple(self.image_tags()) if c.images else (),
            echo_ids=dict(self.echo_ids),
        )


@dataclass(frozen=True)
class ParsedTurn:
    """The sampled output as a message: `message` is what the tree records (a prefill and its
    continuation), `reply` what the harness gets (the continuation only)."""

    message: Message
    reply: Message
    ill_formed: bool = False
    reason: str | None = None


def forced_constraint(
    conversation: Conversation,
    prefill: Message | None,
    tool_parser: str | None,
    reasoning_parser: str | None,
    prompt_end: str = "",
) -> OutputConstraint | None:
    """The constraint a forced tool choice puts on sampling; None when nothing is forced.
    `prompt_end`: the prompt's last text (whether it opened or closed a reasoning block)."""
    if conversation.tool_choice is not ToolChoice.REQUIRED:
        return None
    if prefill is not None:
        raise RequestError("a forced tool choice cannot continue an assistant prefill")
    if tool_parser is None:
        raise RequestError("a forced tool choice needs a tool parser (the adapter has none)")
    names = (
        [conversation.forced_tool]
        if conversation.forced_tool is not None
        else [t["function"]["name"] for t in conversation.tools or ()]
    )
    return forced_tool_call(tool_parser, names, reasoning=reasoning_parser, prompt_end=prompt_end)


def check_family_template(
    pipeline: TurnPipeline, tokenizer: LoadedTokenizer, family: Family, name: str | None
) -> None:
    """Say which parsers the family gives the pipeline, and run the template's first renders
    where they cannot hang or fill the machine (`text.template_check`)."""
    logger.info(
        "model family %s: tool parser %s, reasoning parser %s",
        family.name,
        pipeline.tool_parser,
        pipeline.reasoning_parser,
    )
    check_within_budget(
        pipeline.chat_template,
        name or f"the chat template of {tokenizer.name}",
        call_id=family.call_id,
        variables=tokenizer.special_tokens_map,
    )


def _parser(family: Family | None, value: str | None, attribute: str, default: str) -> str | None:
    """A parser name: `value`, or for `"auto"` the family's (`default` without a family)."""
    if value != AUTO:
        return value
    return default if family is None else getattr(family, attribute)


def _prompt_parts(
    pipeline: TurnPipeline, tokenizer: LoadedTokenizer | None, template_name: str | None
) -> tuple[Splicer | None, PromptBuilder | ObjectPrompts | None]:
    """What builds the pipeline's prompt ids: a splicer and a `PromptBuilder` over the
    template, or, for a tokenizer object that renders its own ids, `ObjectPrompts` (no template
    text to check or splice with); none without a tokenizer."""
    if isinstance(tokenizer, ObjectTokenizer):
        return None, ObjectPrompts(tokenizer)
    if tokenizer is None:
        return None, None
    if pipeline.family is not None:
        check_family_template(pipeline, tokenizer, pipeline.family, template_name)
    splicer = Splicer(tokenizer, pipeline.chat_template, pipeline.family)
    # The manager's backend encodes too, so a whole pipeline runs on one of them.
    encoder = IncrementalEncoder(tokenizer, pipeline.manager.core.backend)
    tokenizer.detokenizer()  # its table made now, not in the first turn's first decode
    return splicer, PromptBuilder(splicer, encoder, pipeline.splice_verify_every)


class TurnPipeline:
    """One turn's steps over a manager, a tokenizer and a chat template.

    Without a tokenizer the pipeline replays recorded turns only (`RecordedPrompt`), as an
    audit of a journal does.

    `splice_verify_every`: how often a spliced tail is checked against the full render (see
    `prompts.PromptBuilder`).

    `tool_parser` and `reasoning_parser` name output formats (`text.formats`); `"auto"` takes
    the model family's (`family`, else the one the template or tokenizer belongs to), None
    turns parsing off. `template_name` names the template in a refusal (`check_within_budget`).
    """

    def __init__(
        self,
        manager: TrajectoryManager,
        tokenizer: LoadedTokenizer | HFTokenizer | None,
        chat_template: str | None = None,
        *,
        restore: Restore | str = Restore.ON,
        history: History | str = History.SPLICE,
        splice_verify_every: int = 8,
        tool_parser: str | None = AUTO,
        reasoning_parser: str | None = AUTO,
        family: str | None = None,
        side_rules: SideRules | None = None,
        template_name: str | None = None,
        restore_by_id: bool = True,
    ) -> None:
        self.manager = manager
        # Off: echoes are recognized by the coarse comparison alone (`trajectory.restore`).
        self.restore_by_id = bool(restore_by_id)
        # Side conversations every session excludes (a session may add its own).
        self.side_rules = side_rules or SideRules()
        tokenizer = None if tokenizer is None else as_loaded(tokenizer)
        self._tokenizer = tokenizer
        self.chat_template = chat_template or (tokenizer.chat_template if tokenizer else "")
        self.restore = parse_kind(Restore, restore, "restore mode")
        self.history = parse_kind(History, history, "history mode")
        self.splice_verify_every = max(1, int(splice_verify_every))
        self.family: Family | None = (
            resolve_family(tokenizer, chat_template, family) if tokenizer else None
        )
        # The vision encoder whose image tokens prompts hold (None: images are `[image]`).
        self.vision: VisionSpec | None = vision_spec(self.family.vision if self.family else None)
        self.tool_parser = _parser(self.family, tool_parser, "tool_parser", "hermes")
        self.reasoning_parser = _parser(self.family, reasoning_parser, "reasoning_parser", "qwen3")
        self._splicer, self._prompts = _prompt_parts(self, tokenizer, template_name)
        # count_tokens encodes through an encoder of its own (see there).
        self._counter: IncrementalEncoder | None = None

    @property
    def tokenizer(self) -> LoadedTokenizer:
        if self._tokenizer is None:
            raise PolicyError("this pipeline has no tokenizer: it replays recorded turns only")
        return self._tokenizer

    @property
    def prompts(self) -> PromptBuilder | ObjectPrompts:
        if self._prompts is None:
            raise PolicyError("this pipeline has no tokenizer: it replays recorded turns only")
        return self._prompts

    @property
    def splicer(self) -> Splicer:
        if isinstance(self._prompts, ObjectPrompts):
            raise RequestError(
                f"{self.tokenizer.name} has no `tokenizers` backend: an assistant prefill needs "
                "a fast tokenizer"
            )
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
        exclude: str | None = None,
        side_rules: SideRules | None = None,
    ) -> PreparedTurn:
        """Split off a prefill, restore the conversation's echoes and build its prompt ids.

        `history` overrides the pipeline's for this turn; `recorded` gives the prompt ids a
        journal holds (recovery), which are then used as they are. `exclude` (a request's
        exclusion header) and `side_rules` (a session's patterns, beside the pipeline's)
        decide whether the turn is excluded from training. Raises `RequestError` for a
        conversation with nothing to record or a forced tool call the turn cannot take, and
        `TemplateError` when the template refuses it.
        """
        timing = timing or TurnTiming()
        context, prefill = split_prefill(conversation.messages)
        if not context:
            what = "before the assistant prefill" if prefill is not None else "to render"
            raise RequestError(f"the request has no messages {what}")
        constraint = forced_constraint(
            conversation, prefill, self.tool_parser, self.reasoning_parser
        )
        restored_before = self.manager.restored_by_tool(sid)
        restored = self.restored(sid, replace(conversation, messages=context))
        render_messages, record_messages, keys = restored.render, restored.record, restored.keys
        restored_tools = [
            tool
            for tool, n in self.manager.restored_by_tool(sid).items()
            for _ in range(n - restored_before.get(tool, 0))
        ]
        timing.lap(Stage.RESTORE)
        held = 0
        continued = None
        if prefill is not None and self._tokenizer is not None:
            continued = prefill_text(
                self.splicer.render,
                render_messages,
                prefill,
                conversation.tools,
                self.tokenizer.eos_token,
            )
        if recorded is not None:
            ids = np.asarray(recorded.prompt_ids, dtype=np.uint32)
            used = recorded.history or History.RENDER
            fallback = recorded.fallback
        elif continued is not None:
            ids = self.prompts.encode(sid, continued.prompt)
            used, fallback = History.RENDER, None
            timing.lap(Stage.RENDER)
        else:
            anchor = None
            if (history or self.history) is History.SPLICE:
                same = render_messages is record_messages
                anchor = self.manager.splice_anchor(sid, render_messages, keys if same else None)
            built = self.prompts.build(sid, render_messages, conversation.tools, anchor, timing)
            ids, used, fallback, held = built.ids, built.history, built.fallback, built.held
        if constraint is not None and self._tokenizer is not None:
            # Whether the prompt opened or closed a reasoning block decides the call's head.
            end = self.tokenizer.decode([int(t) for t in ids[-PROMPT_END_TOKENS:]])
            constraint = forced_constraint(
                conversation, prefill, self.tool_parser, self.reasoning_parser, end
            )
        replay_start = 0
        if self.manager.replay_channels:
            replay_start = self.manager.replay_start(sid, record_messages, ids, keys)
        timing.lap(Stage.TOKENIZE)
        rules = [self.side_rules] + ([side_rules] if side_rules else [])
        pad_id = -1
        if self.vision is not None:
            pad_id = self.tokenizer.token_id(self.vision.pad)
        prepared = PreparedTurn(
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
            held,
            prefill=continued,
            constraint=constraint,
            excluded=exclusion(record_messages, rules, exclude),
            replay_start=replay_start,
            image_pad_id=pad_id,
            echo_ids=restored.echo_ids,
        )
        if pad_id >= 0 and recorded is None:
            # Refuses a prompt whose image tokens are not its images' (text that spells them).
            # A recorded prompt (recovery) was checked when it was served.
            prepared.image_tags()
        return prepared

    def restored(self, sid: str, conversation: Conversation) -> TurnMessages:
        """The restore stage alone: what the template renders and what the tree records."""
        messages = conversation.messages
        if self.restore is Restore.OFF:
            return TurnMessages(list(messages), list(messages))
        c, ids = conversation, conversation.call_ids if self.restore_by_id else None
        restored, keys, echo = self.manager.restore_keyed(sid, messages, c.tools, c.unchanged, ids)
        render = list(messages) if self.restore is Restore.TREE_ONLY else restored
        return TurnMessages(render, restored, keys, echo)

    def render(self, messages: Sequence[Message], tools: Sequence[ToolSchema] | None) -> str:
        """The full prompt text of a conversation, generation prompt included."""
        return self.prompts.render(messages, tools)

    def check_splice(self, sid: str) -> bool | None:
        """Check the session's last splice against the full render, if that check was
        deferred (see `trajectory.prompts`): True passed, False failed (the next turn is
        rendered in full), None when none waited. Run it off the turn's critical path."""
        if self._prompts is None:
            return None
        return self._prompts.check_deferred(sid)

    def splice_check_waits(self, sid: str) -> bool:
        """Whether `check_splice` has a check to run for the session."""
        return self._prompts is not None and self._prompts.deferred(sid)

    def count_tokens(self, conversation: Conversation) -> int:
        """How many tokens the conversation's prompt has, a prefill continued as a turn would
        continue it (nothing is recorded).

        Encoded by the Rust core with the GIL released, through an encoder of its own, so a
        huge count neither holds the interpreter nor waits on the sessions' encoder.
        """
        context, prefill = split_prefill(conversation.messages)
        if not context:
            raise RequestError("the request has no messages to render")
        if isinstance(self._prompts, ObjectPrompts) and prefill is None:
            return self._prompts.count(context, conversation.tools)
        if prefill is not None:
            end = self.tokenizer.eos_token
            text = prefill_text(self.splicer.render, context, prefill, conversation.tools, end)
            prompt = text.prompt
        else:
            prompt = self.render(context, conversation.tools)
        if self._counter is None:
            self._counter = IncrementalEncoder(self.tokenizer, self.manager.core.backend)
        return len(self._counter.encode_full(prompt))

    def unanswered(self, prepared: PreparedTurn) -> list[int]:
        """Recorded turns this prepared turn would retry (same prompt, nothing built on them),
        latest first; see `TrajectoryManager.unanswered_turns`."""
        return self.manager.unanswered_turns(
            prepared.sid, prepared.record_messages, prepared.prompt_ids, prepared.keys
        )

    # -- after the engine -----------------------------------------------------------------------

    def parse(self, prepared: PreparedTurn, output_ids: TokenIds) -> ParsedTurn:
        """The assistant message in the sampled ids; the end-of-turn token is the engine's
        stop, not part of the message. A prefill's text is parsed with the continuation (a
        tool call or reasoning block may span both); the reply is the continuation alone.
        Under `tool_choice: none` calls are not parsed: their markup stays text."""
        text = self.tokenizer.decode_turn(output_ids)
        tool_parser = (
            None if prepared.conversation.tool_choice is ToolChoice.NONE else self.tool_parser
        )

        def parsed(sampled: str) -> ParsedOutput:
            out = parse_output(sampled, tool_parser, self.reasoning_parser, tools=prepared.tools)
            if self.family is not None and not out.ill_formed:
                out = ParsedOutput(self.family.canonical(out.message))
            return out

        prefill = prepared.prefill
        out = parsed(text if prefill is None else prefill.text + text)
        reply = out.message
        if prefill is not None:
            reply = continuation(out.message, prefill.message) or parsed(text).message
        prepared.timing.lap(Stage.PARSE)
        return ParsedTurn(out.message, reply, out.ill_formed, out.reason)

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
                routed_experts=generated.routed_experts,
                indexer_topk=generated.indexer_topk,
                weight_versions=tuple(generated.weight_versions),
                discarded=tuple(generated.discarded),
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
        if self._prompts is not None:
            self._prompts.forget(sid)


def reasoning_tokens(tokenizer: LoadedTokenizer, output_ids: TokenIds, message: Message) -> int:
    """How many sampled tokens are reasoning: up to the reasoning's closing marker when it is
    one token, else the length of the reasoning text encoded."""
    reasoning = message.get("reasoning_content")
    if not reasoning:
        return 0
    ids = [int(x) for x in output_ids]
    close = tokenizer.added_tokens.get("</think>")
    if close is not None and close in ids:
        return ids.index(close) + 1
    return len(tokenizer.encode(reasoning))
