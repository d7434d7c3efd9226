"""The HTTP adapter a harness talks to, as if it were the Anthropic or OpenAI API.

This module is the HTTP layer only: it reads a request, picks the protocol its route belongs
to, runs the turn through the `TurnPipeline` around one engine call, and writes the reply.
A turn is journaled before its reply leaves and recorded once the reply has reached the client.
Errors become JSON in the protocol's shape in one middleware (`adapter.middleware`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tokentrail.adapter.metrics import Metrics
from tokentrail.adapter.middleware import errors_as_json
from tokentrail.adapter.protocols import WireProtocol, protocols
from tokentrail.adapter.protocols.common import Outcome
from tokentrail.adapter.sessions import Session, Sessions
from tokentrail.engines.base import Engine, GenerateRequest, Generation, SamplingParams
from tokentrail.errors import (
    AuthenticationError,
    EngineError,
    RequestError,
    RequestTooLarge,
    SessionError,
    UpstreamError,
)
from tokentrail.kinds import History, Restore, Stage
from tokentrail.messages import Message
from tokentrail.storage.journal import Journal
from tokentrail.text.tokenizer import LoadedTokenizer
from tokentrail.trajectory.manager import Trajectory, TrajectoryManager
from tokentrail.trajectory.pipeline import PreparedTurn, TurnPipeline, TurnTiming
from tokentrail.trajectory.sample import Sample

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 64 * 1024 * 1024


@dataclass
class AdapterConfig:
    model_name: str = "tokentrail"
    tool_parser: str | None = "hermes"
    reasoning_parser: str | None = "qwen3"
    max_turns_per_session: int = 0
    max_context_tokens: int = 0
    admin_token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY
    restore: Restore = Restore.ON
    history: History = History.SPLICE
    # Check a spliced tail against the full render every this many splices (1: every turn).
    splice_verify_every: int = 8
    default_max_tokens: int = 4096
    # Warn once per finished session whose tool-call turns lost more than this share.
    masked_warning_threshold: float = 0.05
    # Refuse turns for sessions not opened with `open_session` (an adapter behind a pool).
    open_sessions_only: bool = False


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Adapter:
    """The adapter: an aiohttp app over one engine, one tokenizer and one `TrajectoryManager`."""

    def __init__(
        self,
        *,
        engine: Engine,
        tokenizer: LoadedTokenizer,
        chat_template: str | None = None,
        manager: TrajectoryManager | None = None,
        config: AdapterConfig | None = None,
        journal: Journal | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config = config or AdapterConfig()
        self.manager = manager or TrajectoryManager()
        self.pipeline = TurnPipeline(
            self.manager,
            tokenizer,
            chat_template,
            restore=config.restore,
            history=config.history,
            splice_verify_every=config.splice_verify_every,
            tool_parser=config.tool_parser,
            reasoning_parser=config.reasoning_parser,
        )
        self.metrics = Metrics()
        self.journal = journal
        self.sessions = Sessions(
            self.pipeline,
            self.metrics,
            journal=journal,
            max_turns_per_session=config.max_turns_per_session,
            masked_warning_threshold=config.masked_warning_threshold,
            open_sessions_only=config.open_sessions_only,
        )
        self.timings: deque[TurnTiming] = deque(maxlen=100_000)
        self.app = web.Application(
            client_max_size=config.max_body_bytes, middlewares=[errors_as_json]
        )
        routes = [
            web.get("/v1/models", self._models),
            web.get("/healthz", self._healthz),
            web.get("/metrics", self._metrics),
            web.get("/", self._root),
            web.post("/tokentrail/sessions/{sid}/finish", self._finish),
            web.delete("/tokentrail/sessions/{sid}", self._drop),
        ]
        for proto in protocols():
            routes.append(web.post(proto.turn_path, self._turn_handler(proto)))
            if proto.count_tokens_path is not None:
                routes.append(web.post(proto.count_tokens_path, self._count_handler(proto)))
        self.app.add_routes(routes)
        self.app.on_cleanup.append(self._close_engine)
        if journal is not None:
            journal.set_meta(
                tokenizer=tokenizer.name,
                chat_template=self.pipeline.chat_template,
                history=str(config.history),
                restore=str(config.restore),
                drift_policy=str(self.manager.drift_policy),
                rewrite_policy=str(self.manager.rewrite_policy),
                fork_threshold=str(self.manager.fork_threshold_tokens),
            )
            self.sessions.recover(journal)

    # -- sessions for trainers ------------------------------------------------------------------

    def open_session(
        self,
        sid: str,
        sampling_defaults: dict[str, Any] | None = None,
        max_context_tokens: int = 0,
        history: History | str | None = None,
    ) -> None:
        """Open (or reopen) a session; `sampling_defaults` fill what a request leaves out,
        `history` overrides the adapter's for this session."""
        self.sessions.open(sid, sampling_defaults, max_context_tokens, history)

    async def finish_trajectory(
        self, sid: str, *, reward: float = 0.0, metadata: dict[str, Any] | None = None
    ) -> Trajectory:
        """Wait for the session's in-flight turns, close it and linearize it."""
        return await self.sessions.finish(sid, reward=reward, metadata=metadata)

    async def finish_session(
        self, sid: str, *, reward: float = 0.0, metadata: dict[str, Any] | None = None
    ) -> list[Sample]:
        return (await self.finish_trajectory(sid, reward=reward, metadata=metadata)).samples

    def drop_session(self, sid: str) -> bool:
        return self.sessions.drop(sid)

    # -- plain routes ---------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(models_list(self.config.model_name))

    async def _healthz(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"status": "ok", "engine": self.engine.name, "sessions": len(self.sessions)}
        )

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.metrics.set_open_sessions(len(self.sessions))
        payload, content_type = self.metrics.render()
        response = web.Response(body=payload)
        response.headers["Content-Type"] = content_type
        return response

    async def _root(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"name": "tokentrail"})

    def _admin(self, request: web.Request) -> None:
        token = self.config.admin_token
        if token and request.headers.get("Authorization") != f"Bearer {token}":
            raise AuthenticationError("admin token required")

    async def _finish(self, request: web.Request) -> web.StreamResponse:
        self._admin(request)
        raw = await _read(request)
        body = _parse_json(raw) if raw.strip() else {}
        reward = body.get("reward", 0.0)
        metadata = body.get("metadata") or {}
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise RequestError("reward must be a number")
        if not isinstance(metadata, dict):
            raise RequestError("metadata must be an object")
        sid = request.match_info["sid"]
        traj = await self.finish_trajectory(sid, reward=float(reward), metadata=metadata)
        return web.json_response(
            {"samples": [s.to_dict() for s in traj.samples], "ledger": traj.ledger.to_dict()}
        )

    async def _drop(self, request: web.Request) -> web.StreamResponse:
        self._admin(request)
        sid = request.match_info["sid"]
        if not self.drop_session(sid):
            raise SessionError(f"unknown session {sid!r}")
        return web.json_response({"dropped": sid})

    async def _close_engine(self, app: web.Application) -> None:
        await self.engine.close()

    # -- protocol routes ------------------------------------------------------------------------

    def _count_handler(self, proto: WireProtocol) -> Handler:
        async def count_tokens(request: web.Request) -> web.StreamResponse:
            body = _parse_json(await _read(request))
            tokens = self.pipeline.count_tokens(proto.translate(body))
            return web.json_response(proto.count_tokens_reply(tokens))

        return count_tokens

    def _turn_handler(self, proto: WireProtocol) -> Handler:
        async def turn(request: web.Request) -> web.StreamResponse:
            self.metrics.in_flight(+1)
            status = 499  # the client went away, unless an answer says otherwise
            try:
                response = await self._admitted_turn(request, proto)
                status = response.status
                return response
            except Exception as exc:
                status = getattr(exc, "status", 500) if not isinstance(exc, EngineError) else 502
                raise
            finally:
                self.metrics.in_flight(-1)
                self.metrics.request_done(proto.name, status)

        return turn

    async def _admitted_turn(self, request: web.Request, proto: WireProtocol) -> web.StreamResponse:
        timing = TurnTiming()
        body = _parse_json(await _read(request))
        sid = proto.session_id(request.headers, body)
        stream = proto.stream_requested(body)
        session = self.sessions.admit(sid)
        try:
            return await self._run_turn(request, proto, body, sid, session, stream, timing)
        except ConnectionResetError:
            logger.debug("session %s: client went away before the reply; turn not recorded", sid)
            return web.Response(status=499)
        finally:
            self.sessions.release(session)

    async def _run_turn(
        self,
        request: web.Request,
        proto: WireProtocol,
        body: dict[str, Any],
        sid: str,
        session: Session,
        stream: bool,
        timing: TurnTiming,
    ) -> web.StreamResponse:
        conversation = proto.translate(body)
        sampling = (
            SamplingParams(max_new_tokens=self.config.default_max_tokens)
            .merged(session.sampling_defaults)
            .merged(proto.sampling(body))
        )
        timing.lap(Stage.TRANSLATE)
        prepared = self.pipeline.prepare(sid, conversation, history=session.history, timing=timing)
        self.metrics.restored(prepared.restored_tools)
        if prepared.fallback is not None:
            self.metrics.splice_fallback(prepared.fallback)

        limit = session.max_context_tokens or self.config.max_context_tokens
        if limit and len(prepared.prompt_ids) > limit:
            # Over the context window: answer `length` without generating; nothing to record.
            empty: Message = {"role": "assistant", "content": ""}
            outcome = Outcome(
                self.config.model_name, empty, [], "length", len(prepared.prompt_ids), 0
            )
            return await write_reply(request, proto, proto.reply(outcome), stream, body)

        rid = uuid.uuid4().hex
        generation = await self._generate(prepared, sampling, sid, rid)
        timing.lap(Stage.ENGINE)
        timing.engine_reported = generation.engine_time_s

        parsed = self.pipeline.parse(prepared, generation.output_ids)
        message = parsed.message
        outcome = Outcome(
            self.config.model_name,
            message,
            [proto.mint_call_id() for _ in message.get("tool_calls") or ()],
            generation.finish_reason,
            len(prepared.prompt_ids),
            len(generation.output_ids),
            output_ids=list(generation.output_ids),
            logprobs=list(generation.logprobs),
        )
        reply = proto.reply(outcome)
        metadata = {
            "protocol": proto.name,
            "request_id": rid,
            "ill_formed": parsed.reason,
            "history": prepared.fallback.label if prepared.fallback else str(prepared.history),
        }
        # Journaled before the reply leaves: a crash after the client got it must not lose the
        # turn. A reply that never reaches the client retracts it again.
        seq = None
        if self.journal is not None:
            seq = self.journal.turn(
                sid,
                translated=conversation.messages,
                prompt_messages=prepared.record_messages,
                response_message=message,
                tools=conversation.tools,
                prompt_ids=prepared.prompt_ids,
                output_ids=generation.output_ids,
                logprobs=generation.logprobs,
                finish_reason=generation.finish_reason,
                ill_formed=parsed.ill_formed,
                metadata=metadata,
                history=prepared.history,
                fallback=prepared.fallback,
            )
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
        )
        try:
            generation = await self.engine.generate(request)
        except EngineError as exc:
            await self.engine.abort(rid)
            raise UpstreamError(f"engine error: {exc}") from None
        return generation


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


def models_list(name: str) -> dict[str, Any]:
    """`GET /v1/models` in a shape both SDKs read: the one served model."""
    model = {
        "id": name,
        "object": "model",
        "type": "model",
        "display_name": name,
        "owned_by": "tokentrail",
        "created": 0,
        "created_at": "1970-01-01T00:00:00Z",
    }
    return {"object": "list", "data": [model], "has_more": False, "first_id": name, "last_id": name}


async def _read(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise RequestTooLarge(f"request body too large: {exc.text}") from None


def _parse_json(raw: bytes) -> dict[str, Any]:
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


async def start_server(
    adapter: Adapter, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Serve `adapter` in the running loop; return the runner (to clean up) and its base URL.

    Handlers are cancelled when their client goes away, so an abandoned turn aborts its engine
    request and is never recorded.
    """
    runner = web.AppRunner(adapter.app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound_host, bound_port = runner.addresses[0][:2]
    return runner, f"http://{bound_host}:{bound_port}"


__all__ = ["Adapter", "AdapterConfig", "start_server"]
