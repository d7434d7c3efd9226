"""One turn over HTTP, for one wire protocol: admit the session, translate the request, prepare
the prompt through the `TurnPipeline`, ask the engine, reply, journal, record.

A turn is journaled before its reply leaves (a crash after the client got it must not lose
it) and recorded in the session's tree once the reply has reached the client; a reply that
never arrives retracts the journaled turn again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import deque
from typing import Any

from aiohttp import web

from tokentrail.adapter.config import AdapterConfig
from tokentrail.adapter.metrics import Metrics
from tokentrail.adapter.protocols import WireProtocol
from tokentrail.adapter.protocols.common import Outcome
from tokentrail.adapter.sessions import Session, Sessions
from tokentrail.engines.base import (
    Engine,
    GenerateRequest,
    Generation,
    ReplayRequest,
    SamplingParams,
)
from tokentrail.errors import (
    ContextTooLong,
    EngineError,
    EngineLimit,
    ReplayError,
    RequestError,
    RequestTooLarge,
    UpstreamError,
)
from tokentrail.kinds import Stage
from tokentrail.messages import Conversation
from tokentrail.storage.journal import Journal
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

# A request carrying this header (any value but "" or "0") is a side conversation: served and
# journaled, its tokens masked as `excluded` (see `trajectory.side`).
EXCLUDE_HEADER = "X-Tokentrail-Exclude"


class TurnRoute:
    """The handler of one protocol's turn route (`WireProtocol.turn_path`)."""

    def __init__(
        self,
        proto: WireProtocol,
        *,
        engine: Engine,
        pipeline: TurnPipeline,
        sessions: Sessions,
        metrics: Metrics,
        settings: AdapterConfig,
        journal: Journal | None,
        timings: deque[TurnTiming],
        replay: ReplayRequest | None = None,
    ) -> None:
        self.proto = proto
        self.engine = engine
        self.pipeline = pipeline
        self.manager = pipeline.manager
        self.sessions = sessions
        self.metrics = metrics
        self.settings = settings
        self.journal = journal
        self.timings = timings
        self.replay = replay or ReplayRequest()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The route's aiohttp handler."""
        proto = self.proto
        self.metrics.in_flight(+1)
        status = 499  # the client went away, unless an answer says otherwise
        try:
            response = await self._admitted(request, proto)
            status = response.status
            return response
        except Exception as exc:
            status = getattr(exc, "status", 500) if not isinstance(exc, EngineError) else 502
            raise
        finally:
            self.metrics.in_flight(-1)
            self.metrics.request_done(proto.name, status)

    async def _admitted(self, request: web.Request, proto: WireProtocol) -> web.StreamResponse:
        timing = TurnTiming()
        body = parse_json(await read_body(request))
        sid = proto.session_id(request.headers, body)
        stream = proto.stream_requested(body)
        session = self.sessions.admit(sid)
        try:
            return await self._run(request, proto, body, sid, session, stream, timing)
        except ConnectionResetError:
            logger.debug("session %s: client went away before the reply; turn not recorded", sid)
            return web.Response(status=499)
        finally:
            self.sessions.release(session)

    async def _run(
        self,
        request: web.Request,
        proto: WireProtocol,
        body: dict[str, Any],
        sid: str,
        session: Session,
        stream: bool,
        timing: TurnTiming,
    ) -> web.StreamResponse:
        conversation = translate(proto, body, self.manager, sid)
        sampling = (
            SamplingParams(max_new_tokens=self.settings.default_max_tokens)
            .merged(session.sampling_defaults)
            .merged(proto.sampling(body))
        )
        timing.lap(Stage.TRANSLATE)
        header = request.headers.get(EXCLUDE_HEADER, "")
        prepared = self.pipeline.prepare(
            sid,
            conversation,
            history=session.history,
            timing=timing,
            exclude=header if header not in ("", "0") else None,
            side_rules=session.side_rules,
        )
        self.metrics.restored(prepared.restored_tools)
        self.metrics.dropped_media(conversation.dropped_media)
        if prepared.fallback is not None:
            self.metrics.splice_fallback(prepared.fallback)
        check_can_generate(
            prepared, session.max_context_tokens or self.settings.max_context_tokens, self.engine
        )

        rid = uuid.uuid4().hex
        generation = await self._generate(prepared, sampling, sid, rid)
        timing.lap(Stage.ENGINE)
        timing.engine_reported = generation.engine_time_s

        parsed = self.pipeline.parse(prepared, generation.output_ids)
        message = parsed.message
        outcome = Outcome(
            self.settings.model_name,
            parsed.reply,
            [proto.mint_call_id() for _ in parsed.reply.get("tool_calls") or ()],
            generation.finish_reason,
            len(prepared.prompt_ids),
            len(generation.output_ids),
            cached_tokens=prepared.held_tokens,
            reasoning_tokens=reasoning_tokens(
                self.pipeline.tokenizer, generation.output_ids, parsed.reply
            ),
            output_ids=list(generation.output_ids),
            logprobs=list(generation.logprobs),
            reply_id=proto.mint_reply_id(),
            body=body,
        )
        if proto.wants_logprobs(body):
            outcome.token_logprobs = token_logprobs(self.pipeline.tokenizer, generation)
        reply = proto.reply(outcome)
        metadata = {
            "protocol": proto.name,
            "request_id": rid,
            "reply_id": outcome.reply_id,
            "call_ids": outcome.call_ids,
            "ill_formed": parsed.reason,
            "history": prepared.fallback.label if prepared.fallback else str(prepared.history),
            **prepared.tags,
        }
        # Journaled before the reply leaves: a crash after the client got it must not lose the
        # turn. A reply that never reaches the client retracts it again.
        seq = None
        if self.journal is not None:
            seq = journal_turn(self.journal, prepared, generation, parsed, metadata)
        try:
            response = await write_reply(request, proto, reply, stream, body)
        except (ConnectionResetError, asyncio.CancelledError):
            if seq is not None and self.journal is not None:
                self.journal.retract(sid, seq)
            raise
        timing.lap(Stage.RESPOND)

        self.pipeline.record(
            prepared, generation, message, ill_formed=parsed.ill_formed, metadata=metadata
        )
        session.turns += 1
        self.metrics.observe_turn(timing.stages)
        self.timings.append(timing)
        return response

    async def _generate(
        self, prepared: PreparedTurn, sampling: SamplingParams, sid: str, rid: str
    ) -> Generation:
        request = GenerateRequest(
            input_ids=prepared.prompt_ids,
            sampling=sampling,
            session_id=sid,
            request_id=rid,
            messages=prepared.record_messages,
            tools=prepared.tools,
            constraint=prepared.constraint,
            replay=self.replay.from_position(prepared.replay_start),
        )
        try:
            generation = await self.engine.generate(request)
        except EngineError as exc:
            await self.engine.abort(rid)
            raise UpstreamError(f"engine error: {exc}") from None
        return generation


def journal_turn(
    journal: Journal,
    prepared: PreparedTurn,
    generation: Generation,
    parsed: ParsedTurn,
    metadata: dict[str, Any],
) -> int:
    """Journal a served turn (before its reply leaves); returns its sequence number."""
    return journal.turn(
        prepared.sid,
        translated=prepared.conversation.messages,
        prompt_messages=prepared.record_messages,
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
        routed_experts=generation.routed_experts,
        indexer_topk=generation.indexer_topk,
        weight_versions=generation.weight_versions,
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
    if prepared.constraint is not None and not getattr(engine, "supports_constraints", False):
        raise EngineLimit(
            f"tool_choice forces {prepared.constraint.wants}, but the {engine.name} engine "
            "cannot constrain its output (no structured output)"
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


def translate(
    proto: WireProtocol, body: dict[str, Any], manager: TrajectoryManager, sid: str
) -> Conversation:
    """The request's conversation; one that continues an earlier reply (`previous_response_id`)
    is that turn's conversation from the session's tree, then the new input."""
    ref = proto.continues(body)
    if ref is None:
        return proto.translate(body)
    found = manager.find_turn(sid, "reply_id", ref)
    if found is None:
        raise RequestError(f"unknown previous response {ref!r} in this session")
    prior, metadata = found
    return proto.translate_after(body, prior, list(metadata.get("call_ids") or []))


async def write_reply(
    request: web.Request,
    proto: WireProtocol,
    reply: dict[str, Any],
    stream: bool,
    body: dict[str, Any],
) -> web.StreamResponse:
    """Write the whole response and flush it; raises if the client went away first."""
    if stream:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for frame in proto.stream(reply, body):
            await response.write(frame)
    else:
        payload = json.dumps(reply, ensure_ascii=False).encode()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(payload)
        await response.prepare(request)
        await response.write(payload)
    await response.write_eof()
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("client disconnected before the response was flushed")
    return response


async def read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise RequestTooLarge(f"request body too large: {exc.text}") from None


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"body is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise RequestError(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(f"body must be a JSON object, got {type(body).__name__}")
    return body
