"""One turn's way through the adapter, from a checked turn request to a recorded turn: prepare
the prompt, call the engine, check its output, answer, journal, record. The HTTP layer
(`adapter.http.server`) reads the request, `adapter.request` parses, limits and translates it,
and the `TurnRequest` comes here.

Each CPU-heavy step runs in `Offload`'s workers (a session's steps in its lane, one at a time);
the loop only awaits them, the engine and the socket.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiohttp import web

from tokentrail.adapter.config import AdapterConfig
from tokentrail.adapter.http import notes as request_notes
from tokentrail.adapter.http.middleware import failed_in_stream
from tokentrail.adapter.metrics import Metrics
from tokentrail.adapter.offload import Offload
from tokentrail.adapter.protocols import WireProtocol
from tokentrail.adapter.protocols.base import fill_call_ids
from tokentrail.adapter.protocols.outcome import Outcome
from tokentrail.adapter.request.context import ContextLength
from tokentrail.adapter.request.limits import Limits
from tokentrail.adapter.request.reader import EXCLUDE_HEADER, TurnRequest
from tokentrail.adapter.session.sessions import Session, Sessions
from tokentrail.adapter.turn.answers import RecordedAnswer, is_empty, requested_retry, sampling_key
from tokentrail.adapter.turn.live import KEEPALIVE_S, LiveReply
from tokentrail.adapter.turn.slots import EngineSlots
from tokentrail.adapter.turn.whole_reply import send_whole, write_reply
from tokentrail.engines.base import (
    Engine,
    GenerateRequest,
    Generation,
    ReplayRequest,
    SamplingParams,
)
from tokentrail.engines.streaming import StreamingEngine, TokenSink
from tokentrail.engines.validation import CHECK_INLINE_TOKENS, check_generation
from tokentrail.errors import (
    ContextTooLong,
    EngineError,
    EngineLimit,
    EngineOutputError,
    EngineRefusedRequest,
    ReplayError,
    RequestError,
    TokentrailError,
    UpstreamError,
)
from tokentrail.kinds import EngineFault, Retry, Stage, ToolChoice
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.record import JournaledTurn
from tokentrail.text.tokenizer import LoadedTokenizer
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.pipeline import (
    ParsedTurn,
    PreparedTurn,
    TurnPipeline,
    TurnTiming,
    reasoning_tokens,
)

logger = logging.getLogger(__name__)

__all__ = ["EXCLUDE_HEADER", "TurnRequest", "Turns", "write_reply"]


@dataclass
class TurnSettings:
    """What of the adapter's configuration a turn reads."""

    model_name: str
    default_max_tokens: int
    # The rollout's context budget: a prompt over it is refused (0: no such budget).
    max_context_tokens: int
    # The model's context length from its config (0: unknown).
    context_tokens: int
    # What a retried request gets unless the session or the request says otherwise.
    retry: Retry = Retry.REPLAY
    # Stream replies to the harness as they are sampled (`adapter.turn.live`), with a keepalive
    # whenever nothing else went out for `keepalive_s`; off: a streamed reply is written
    # whole once the turn is done.
    live_stream: bool = False
    keepalive_s: float = KEEPALIVE_S


class Turns:
    """Runs turns over one pipeline, engine and set of sessions."""

    def __init__(
        self,
        *,
        settings: TurnSettings,
        limits: Limits,
        pipeline: TurnPipeline,
        sessions: Sessions,
        offload: Offload,
        metrics: Metrics,
        engine: Engine,
        tokenizer: LoadedTokenizer,
        journal: Journal | None,
        replay: ReplayRequest | None = None,
    ) -> None:
        self.settings = settings
        self.limits = limits
        self.pipeline = pipeline
        self.sessions = sessions
        self.offload = offload
        self.metrics = metrics
        self.engine = engine
        self.tokenizer = tokenizer
        self.journal = journal
        self.replay = replay or ReplayRequest()
        self.vocab_size = tokenizer.vocab_size
        self.timings: deque[TurnTiming] = deque(maxlen=100_000)
        self.engine_slots = EngineSlots(self.limits.engine_concurrency)
        # A whole reply, built in a worker, to a client given `--idle-connection-timeout`.
        self.send = partial(send_whole, offload=offload, timeout_s=limits.idle_connection_s)
        # What a prompt may fill: the engine's served context, else the model's.
        self.context = ContextLength(engine, settings.context_tokens)
        # Turns cut short by their client, being recorded (strong references).
        self._background: set[asyncio.Task[None]] = set()

    # -- on the loop: the turn ------------------------------------------------------------------

    async def run(
        self,
        request: web.Request,
        proto: WireProtocol,
        turn: TurnRequest,
        session: Session,
        timing: TurnTiming,
    ) -> web.StreamResponse:
        sid = turn.sid
        prepared = await self.offload.run(
            partial(
                self.pipeline.prepare,
                sid,
                turn.conversation,
                history=session.history,
                timing=timing,
                exclude=turn.exclude,
                side_rules=session.side_rules,
            ),
            session=sid,
        )
        self.metrics.restored(prepared.restored_tools)
        self.metrics.dropped_media(turn.conversation.dropped_media)
        if prepared.fallback is not None:
            self.metrics.splice_fallback(prepared.fallback)

        prompt_tokens = len(prepared.prompt_ids)
        model_context = await self.context.tokens()
        self.limits.check_prompt(prompt_tokens, model_context)
        budget = session.max_context_tokens or self.settings.max_context_tokens
        check_can_generate(prepared, budget, self.engine)
        context = min((c for c in (model_context, budget) if c), default=0)
        sampling = self.limits.fit_output(turn.sampling, prompt_tokens, context)

        key = sampling_key(sampling)
        retry = requested_retry(request.headers) or session.retry or self.settings.retry
        earlier = self.pipeline.unanswered(prepared)
        if retry is Retry.REPLAY:
            answer = session.answers.find(earlier, proto.name, key)
            if answer is None:
                answer = await session.answers.wait_in_flight(prepared, proto.name, key)
            if answer is not None:
                # Nothing is generated or recorded again: the recorded reply goes out.
                self.sessions.answered_again(sid, answer)
                return await self.send(request, proto, answer.reply, turn)
        if earlier:
            logger.debug("session %s: a retry generated again; turn %s superseded", sid, earlier)
            self.metrics.retried(recorded=False)
        pending = session.answers.start(prepared, proto.name, key)
        live = live_reply(self, request, proto, turn, prepared)
        try:
            answer = await self._generate_and_keep(
                proto, turn, session, prepared, sampling, key, timing, bool(earlier), live
            )
        except TokentrailError as exc:
            session.answers.done(pending, None)
            if live is not None and live.started:
                # The 200 went out: the error goes in the stream, in the protocol's shape.
                failed_in_stream(request, exc.status, str(exc))
                return await live.fail(exc.status, exc.kind, str(exc))
            raise
        except BaseException:
            session.answers.done(pending, None)
            if live is not None:
                await live.abandon()
            raise
        session.answers.done(pending, answer)
        # The turn is kept whether or not this reply arrives: a retry is answered from it.
        if live is not None:
            response = await live.finish(answer.reply, live.parsed_reply)
        else:
            response = await self.send(request, proto, answer.reply, turn)
        if self.pipeline.splice_check_waits(sid):
            self.sessions.after(sid, self.pipeline.check_splice)
        timing.lap(Stage.RESPOND)
        self.metrics.observe_turn(timing.stages)
        self.timings.append(timing)
        return response

    async def _generate_and_keep(
        self,
        proto: WireProtocol,
        turn: TurnRequest,
        session: Session,
        prepared: PreparedTurn,
        sampling: SamplingParams,
        key: str,
        timing: TurnTiming,
        supersede: bool,
        live: LiveReply | None = None,
    ) -> RecordedAnswer:
        """Generate the turn, then journal and record it before its reply leaves (a crash from
        there on must not lose it); returns the reply as kept for retries. With `supersede` it
        replaces the earlier turns of its prompt (a retry answered fresh)."""
        sid = turn.sid
        rid = uuid.uuid4().hex
        notes = request_notes.current()
        notes.request_id, notes.prompt_tokens = rid, len(prepared.prompt_ids)
        if live is not None:
            await live.start()
        try:
            generation = await self._generate(
                prepared, sampling, sid, rid, None if live is None else live.sink
            )
        except asyncio.CancelledError:
            if live is not None:
                # The harness went away mid-stream (the engine request is stopped by the
                # cancel): what it was sent is recorded, masked, in the background.
                self.metrics.client_disconnected()
                if live.ids:
                    task = asyncio.ensure_future(
                        keep_cut_short(self, proto, session, prepared, live, rid)
                    )
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
            raise
        notes.output_tokens = len(generation.output_ids)
        timing.lap(Stage.ENGINE)
        timing.engine_reported = generation.engine_time_s

        parsed, reply, outcome = await self.offload.run(
            self._answer, proto, prepared, generation, turn.body, live
        )
        if live is not None:
            live.parsed_reply = parsed.message
        metadata = dataclasses.replace(
            prepared.tags,
            protocol=proto.name,
            request_id=rid,
            reply_id=outcome.reply_id,
            call_ids=tuple(outcome.call_ids),
            ill_formed=parsed.reason,
            history=prepared.fallback.label if prepared.fallback else str(prepared.history),
        ).as_metadata()
        answer = RecordedAnswer(0, 0, proto.name, key, reply, is_empty(parsed.message))
        # Shielded: once generated, the turn is journaled and recorded even if the client
        # goes away meanwhile (a retry of it is then answered from the record).
        keep = asyncio.ensure_future(
            self._keep(session, prepared, generation, parsed, metadata, answer, supersede)
        )
        return await asyncio.shield(keep)

    async def _keep(
        self,
        session: Session,
        prepared: PreparedTurn,
        generation: Generation,
        parsed: ParsedTurn,
        metadata: dict[str, Any],
        answer: RecordedAnswer,
        supersede: bool,
    ) -> RecordedAnswer:
        sid = prepared.sid
        seq = 0
        if self.journal is not None:
            journaled = answer.journaled()
            seq = await self.offload.journal(
                partial(
                    journal_turn,
                    self.journal,
                    prepared,
                    generation,
                    parsed,
                    metadata,
                    answer=journaled,
                    supersedes=supersede,
                )
            )
        # Counted before the step: the session must not look empty and be forgotten.
        session.turns += 1
        index = await self.offload.run(
            partial(
                self.pipeline.record,
                prepared,
                generation,
                parsed.message,
                ill_formed=parsed.ill_formed,
                metadata=metadata,
                supersede=supersede,
            ),
            session=sid,
        )
        kept = dataclasses.replace(answer, turn=index, seq=seq)
        session.answers.remember(kept)
        return kept

    def _answer(
        self,
        proto: WireProtocol,
        prepared: PreparedTurn,
        generation: Generation,
        body: dict[str, Any],
        live: LiveReply | None = None,
    ) -> tuple[ParsedTurn, dict[str, Any], Outcome]:
        """The sampled ids as a message, and the protocol's reply to the harness (the reply
        to a prefill holds the continuation alone). A `live` reply keeps the ids it sent: the
        reply's, its calls' and its parts'."""
        parsed = self.pipeline.parse(prepared, generation.output_ids)
        reply = parsed.reply
        stream = None if live is None else live.stream
        given = [] if stream is None else stream.call_ids
        outcome = Outcome(
            self.settings.model_name,
            reply,
            fill_call_ids(proto, given, len(reply.get("tool_calls") or ())),
            generation.finish_reason,
            len(prepared.prompt_ids),
            len(generation.output_ids),
            cached_tokens=prepared.held_tokens,
            reasoning_tokens=reasoning_tokens(self.tokenizer, generation.output_ids, reply),
            output_ids=list(generation.output_ids),
            logprobs=list(generation.logprobs),
            reply_id=proto.mint_reply_id() if live is None else live.reply_id,
            body=body,
            item_ids={} if stream is None else stream.item_ids,
        )
        if proto.wants_logprobs(body):
            outcome.token_logprobs = token_logprobs(self.tokenizer, generation)
        return parsed, proto.reply(outcome), outcome

    async def _generate(
        self,
        prepared: PreparedTurn,
        sampling: SamplingParams,
        sid: str,
        rid: str,
        sink: TokenSink | None = None,
    ) -> Generation:
        """One engine call, its output checked; any failure is a 502 with an abort sent and
        nothing recorded, counted by fault. With a `sink`, the tokens go to it as the engine
        streams them (all at the end from an engine that does not stream)."""
        request = generate_request(prepared, sampling, sid, rid, self.replay)
        try:
            async with self.engine_slots.slot():
                if sink is not None and isinstance(self.engine, StreamingEngine):
                    generation = await self.engine.generate_streaming(request, sink)
                else:
                    generation = await self.engine.generate(request)
                    if sink is not None and generation.output_ids:
                        sink(generation.output_ids, generation.logprobs)
            check = partial(
                check_generation,
                generation,
                max_new_tokens=sampling.max_new_tokens,
                vocab_size=self.vocab_size,
                end_token_ids=self.tokenizer.end_token_ids,
            )
            if len(generation.output_ids) > CHECK_INLINE_TOKENS:  # a long walk: in a worker
                await self.offload.run(check)
            else:
                check()
        except EngineError as exc:
            await self.engine.abort(rid)
            if isinstance(exc, EngineRefusedRequest):
                # The request is wrong (over the served context, a parameter out of range):
                # the protocol's 400, which the harness can act on and an SDK does not retry.
                raise RequestError(f"the engine refused the request: {exc}") from None
            fault = exc.fault if isinstance(exc, EngineOutputError) else EngineFault.FAILED
            self.metrics.engine_error(str(fault))
            raise UpstreamError(f"engine error: {exc}") from None
        return generation


def live_reply(
    turns: Turns,
    request: web.Request,
    proto: WireProtocol,
    turn: TurnRequest,
    prepared: PreparedTurn,
) -> LiveReply | None:
    """A reply streamed as sampled, for a streamed request when `live_stream` is on (a
    prefill's reply streams its continuation)."""
    if not (turn.stream and turns.settings.live_stream):
        return None
    tool_choice = prepared.conversation.tool_choice
    family = turns.pipeline.family
    return LiveReply(
        request,
        proto,
        turn.body,
        tokenizer=turns.tokenizer,
        tool_parser=None if tool_choice is ToolChoice.NONE else turns.pipeline.tool_parser,
        reasoning_parser=turns.pipeline.reasoning_parser,
        # An unknown family's prompt may open the block: its content waits to be sure.
        prompt_opens_reasoning=family is None or family.prompt_opens_reasoning,
        model=turns.settings.model_name,
        prompt_tokens=len(prepared.prompt_ids),
        tools=prepared.tools,
        keepalive_s=turns.settings.keepalive_s,
        on_mismatch=turns.metrics.stream_mismatched,
        prefill=prepared.prefill,
    )


async def keep_cut_short(
    turns: Turns,
    proto: WireProtocol,
    session: Session,
    prepared: PreparedTurn,
    live: LiveReply,
    rid: str,
) -> None:
    """Record, and journal, a turn cut short by a client gone mid-stream: the tokens the
    engine streamed until it was stopped, finish `abort`, masked `client_disconnected`.
    Nothing answers a retry from it: a retry is generated fresh and supersedes it."""
    generation = Generation(
        list(live.ids), list(live.logprobs), "abort", len(prepared.prompt_ids), 0.0
    )
    try:
        parsed = await turns.offload.run(turns.pipeline.parse, prepared, generation.output_ids)
        metadata = dataclasses.replace(
            prepared.tags,
            protocol=proto.name,
            request_id=rid,
            reply_id=live.reply_id,
            call_ids=(),
            ill_formed=parsed.reason,
            history=prepared.fallback.label if prepared.fallback else str(prepared.history),
            client_disconnected=True,
        ).as_metadata()
        if turns.journal is not None:
            await turns.offload.journal(
                partial(journal_turn, turns.journal, prepared, generation, parsed, metadata)
            )
        session.turns += 1
        await turns.offload.run(
            partial(
                turns.pipeline.record,
                prepared,
                generation,
                parsed.message,
                ill_formed=parsed.ill_formed,
                metadata=metadata,
            ),
            session=prepared.sid,
        )
    except Exception as exc:
        logger.warning(
            "session %s: a turn cut short by its client was not recorded: %s", prepared.sid, exc
        )


def journal_turn(
    journal: Journal,
    prepared: PreparedTurn,
    generation: Generation,
    parsed: ParsedTurn,
    metadata: dict[str, Any],
    *,
    answer: dict[str, Any] | None = None,
    supersedes: bool = False,
) -> int:
    """Journal a served turn (before its reply leaves); returns its session sequence number."""
    turn = JournaledTurn(
        sid=prepared.sid,
        translated=prepared.conversation.messages,
        response_message=parsed.message,
        tools=prepared.conversation.tools,
        prompt_ids=prepared.prompt_ids,
        output_ids=generation.output_ids,
        logprobs=generation.logprobs,
        finish_reason=generation.finish_reason,
        ill_formed=parsed.ill_formed,
        metadata=metadata,
        history=prepared.history,
        fallback=prepared.fallback,
        answer=answer,
        supersedes=supersedes,
        routed_experts=generation.routed_experts,
        indexer_topk=generation.indexer_topk,
        weight_versions=generation.weight_versions,
        discarded=generation.discarded,
    )
    return journal.turn(turn, keyed=(prepared.record_messages, prepared.keys or ()))


def generate_request(
    prepared: PreparedTurn,
    sampling: SamplingParams,
    sid: str,
    rid: str,
    replay: ReplayRequest,
) -> GenerateRequest:
    """The engine request of a prepared turn: its prompt ids, what the engine constrains and
    replays, and its images."""
    return GenerateRequest(
        input_ids=prepared.prompt_ids,
        sampling=sampling,
        session_id=sid,
        request_id=rid,
        messages=prepared.record_messages,
        tools=prepared.tools,
        constraint=prepared.constraint,
        replay=replay.from_position(prepared.replay_start),
        images=list(prepared.conversation.images),
        image_pad_id=prepared.image_pad_id,
    )


def replay_request(config: AdapterConfig, manager: TrajectoryManager) -> ReplayRequest:
    """What every turn asks the engine for beyond ids; the start is each turn's own."""
    for wanted, shape, flag in (
        (config.routed_experts, manager.routing, "routing"),
        (config.indexer_topk, manager.indexer, "indexer"),
    ):
        if wanted and shape is None:
            raise ReplayError(
                f"asking for {flag} replay needs the model's {flag} shape: give the manager "
                f"one (TrajectoryManager({flag}=...), `tokentrail serve --{flag}-shape` or the "
                "model's config.json)"
            )
    return ReplayRequest(
        routed_start=0 if config.routed_experts else None,
        routing=manager.routing,
        indexer=manager.indexer if config.indexer_topk else None,
    )


def check_can_generate(prepared: PreparedTurn, context_limit: int, engine: Engine) -> None:
    """Refuse, before generating, a prompt over the context limit (as the real APIs do, so the
    harness compacts) and a forced tool call the engine cannot constrain itself to."""
    n = len(prepared.prompt_ids)
    if context_limit and n > context_limit:
        raise ContextTooLong(
            f"prompt is too long: {n} tokens > {context_limit} maximum (this model's maximum "
            f"context length is {context_limit} tokens)"
        )
    if prepared.constraint is not None and not engine.supports_constraints:
        raise EngineLimit(
            f"tool_choice forces {prepared.constraint.wants}, but the {engine.name} engine "
            "cannot constrain its output (no structured output)"
        )
    if prepared.conversation.images and not engine.supports_images:
        raise EngineLimit(
            f"the prompt holds {len(prepared.conversation.images)} images, but the "
            f"{engine.name} engine takes no images with token ids (sglang:// and vllm:// do)"
        )


def token_logprobs(tokenizer: LoadedTokenizer, generation: Generation) -> list[tuple[str, float]]:
    """Text and logprob of each sampled token, the end-of-turn token left out (as the OpenAI
    API leaves it out)."""
    ids = list(generation.output_ids)
    end = len(ids)
    while end and ids[end - 1] in tokenizer.end_token_ids:
        end -= 1
    return [
        (tokenizer.decode([t]), float(lp))
        for t, lp in zip(ids[:end], generation.logprobs, strict=False)
    ]
