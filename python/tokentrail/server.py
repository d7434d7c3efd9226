"""The HTTP adapter a harness talks to, as if it were the Anthropic or OpenAI API.

Every turn runs the same steps in the same order (`Adapter._turn`): parse, session, guards,
translate, restore, render, tokenize, engine, decode, parse, reply, respond, record. A turn is
recorded only once its response has reached the client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tokentrail.chat_template import TemplateError
from tokentrail.engines.base import Engine, EngineError, GenerateRequest, SamplingParams
from tokentrail.errors import RequestError, TokentrailError
from tokentrail.incremental import IncrementalEncoder
from tokentrail.journal import OPEN, TURN, Journal, decode_turn
from tokentrail.manager import Trajectory, TrajectoryManager
from tokentrail.metrics import Metrics, warn_if_masked
from tokentrail.parsing import parse_output
from tokentrail.pipeline import Restore, TurnMessages, prompt_messages_for_turn
from tokentrail.protocols import anthropic, openai
from tokentrail.protocols.common import Translated, mint_id
from tokentrail.replay import replay_turn
from tokentrail.sample import Sample
from tokentrail.splice import History, Splicer, prompt_ids_for_turn
from tokentrail.tokenizer import LoadedTokenizer
from tokentrail.turn import TurnRecord

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 64 * 1024 * 1024
STAGES = (
    "translate",
    "restore",
    "render",
    "tokenize",
    "engine",
    "parse",
    "respond",
    "record",
)


class HTTPError(Exception):
    """An answer other than 200, with the message the client will read."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


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


@dataclass
class _Session:
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    max_context_tokens: int = 0
    history: History | None = None
    in_flight: int = 0
    # Splices made, and the shapes of new messages whose splice was checked against a full
    # render in this session.
    splices: int = 0
    verified: set[tuple[str, ...]] = field(default_factory=set)
    turns: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()


@dataclass
class TurnTiming:
    """Seconds spent in each stage of one turn."""

    stages: dict[str, float] = field(default_factory=dict)

    @property
    def overhead(self) -> float:
        return sum(v for k, v in self.stages.items() if k != "engine")


class _Clock:
    def __init__(self) -> None:
        self.timing = TurnTiming()
        self._t = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timing.stages[stage] = self.timing.stages.get(stage, 0.0) + now - self._t
        self._t = now


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
        self.chat_template = chat_template or tokenizer.chat_template
        self.manager = manager or TrajectoryManager()
        self.config = config or AdapterConfig()
        self._sessions: dict[str, _Session] = {}
        self._closed: set[str] = set()
        self.timings: deque[TurnTiming] = deque(maxlen=100_000)
        self.splicer = Splicer(tokenizer, self.chat_template)
        # Full renders (first turns, render history, fallbacks) reuse the ids of the prefix
        # a session's previous prompt shares with them.
        self.encoder = IncrementalEncoder(tokenizer)
        self.splice_fallbacks: Counter[str] = Counter()
        self.metrics = Metrics()
        self._end_ids = {tokenizer.eos_token_id}
        for token in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            if token in tokenizer.added_tokens:
                self._end_ids.add(tokenizer.added_tokens[token])
        self.app = web.Application(client_max_size=self.config.max_body_bytes)
        self.app.add_routes(
            [
                web.post("/v1/messages", self._anthropic_messages),
                web.post("/v1/messages/count_tokens", self._anthropic_count_tokens),
                web.post("/v1/chat/completions", self._openai_chat),
                web.get("/v1/models", self._models),
                web.get("/healthz", self._healthz),
                web.get("/metrics", self._metrics),
                web.get("/", self._root),
                web.post("/tokentrail/sessions/{sid}/finish", self._finish_http),
                web.delete("/tokentrail/sessions/{sid}", self._drop_http),
            ]
        )
        self.app.on_cleanup.append(self._close_engine)
        self.journal = journal
        self._replaying = False
        if journal is not None:
            self._recover(journal)

    def _recover(self, journal: Journal) -> None:
        """Rebuild the unfinished sessions of a journal, as if their turns were served again."""
        journal.set_meta(
            tokenizer=self.tokenizer.name,
            chat_template=self.chat_template,
            history=str(self.config.history),
            restore=str(self.config.restore),
            drift_policy=self.manager.drift_policy,
            rewrite_policy=self.manager.rewrite_policy,
            fork_threshold=str(self.manager.fork_threshold_tokens),
        )
        live = set(journal.recovery.unfinished_sessions())
        retracted = journal.recovery.retracted()
        self._replaying = True
        try:
            for event in journal.events():
                if event.sid not in live:
                    self._closed.add(event.sid)
                    continue
                if event.kind == OPEN:
                    settings = event.data
                    self.open_session(
                        event.sid,
                        settings.get("sampling_defaults"),
                        settings.get("max_context_tokens", 0),
                        settings.get("history"),
                    )
                elif event.kind == TURN and event.seq not in retracted:
                    turn = decode_turn(journal, event)
                    replay_turn(self.manager, turn, restore=self.config.restore)
                    session = self._sessions.setdefault(event.sid, _Session())
                    session.turns += 1
        finally:
            self._replaying = False
            journal.release()
        if live:
            logger.info("journal: rebuilt %d unfinished sessions", len(live))

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
        if not isinstance(sid, str) or not sid:
            raise RequestError("session id must be a non-empty string")
        self._closed.discard(sid)
        self._sessions[sid] = _Session(
            dict(sampling_defaults or {}),
            int(max_context_tokens),
            History(history) if history is not None else None,
        )
        if self.journal is not None and not self._replaying:
            self.journal.session_opened(
                sid,
                {
                    "sampling_defaults": dict(sampling_defaults or {}),
                    "max_context_tokens": int(max_context_tokens),
                    "history": str(history) if history is not None else None,
                },
            )

    async def finish_trajectory(
        self, sid: str, *, reward: float = 0.0, metadata: dict[str, Any] | None = None
    ) -> Trajectory:
        """Wait for the session's in-flight turns, close it and linearize it."""
        session = self._sessions.get(sid)
        if session is None and not self.manager.has_session(sid):
            raise KeyError(sid)
        self._closed.add(sid)
        if session is not None:
            await session.idle.wait()
            self._sessions.pop(sid, None)
        trajectory = self.manager.finish(sid, reward=reward, extra_metadata=metadata)
        self.encoder.forget(sid)
        if self.journal is not None:
            self.journal.session_finished(sid, reward, metadata or {})
        self.metrics.session_finished(trajectory)
        warn_if_masked(logger, sid, trajectory.ledger, self.config.masked_warning_threshold)
        return trajectory

    async def finish_session(
        self, sid: str, *, reward: float = 0.0, metadata: dict[str, Any] | None = None
    ) -> list[Sample]:
        return (await self.finish_trajectory(sid, reward=reward, metadata=metadata)).samples

    def drop_session(self, sid: str) -> bool:
        known = self._sessions.pop(sid, None) is not None
        known = self.manager.drop_session(sid) or known
        self.encoder.forget(sid)
        self._closed.add(sid)
        if known and self.journal is not None:
            self.journal.session_dropped(sid)
        if known:
            self.metrics.session_dropped()
        return known

    def _session(self, sid: str) -> _Session:
        if sid in self._closed:
            raise HTTPError(503, f"session {sid!r} is closed", "overloaded_error")
        session = self._sessions.get(sid)
        if session is None:
            session = self._sessions[sid] = _Session()
        cap = self.config.max_turns_per_session
        if cap and session.turns + session.in_flight >= cap:
            raise HTTPError(
                429, f"session {sid!r} reached its limit of {cap} turns", "rate_limit_error"
            )
        return session

    # -- HTTP handlers --------------------------------------------------------------------------

    async def _anthropic_messages(self, request: web.Request) -> web.StreamResponse:
        return await self._turn(request, _ANTHROPIC)

    async def _openai_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._turn(request, _OPENAI)

    async def _anthropic_count_tokens(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _read_json(request)
            translated = anthropic.translate_request(body)
            text = self._render(translated.messages, translated.tools)
            return web.json_response({"input_tokens": len(self.tokenizer.encode(text))})
        except HTTPError as exc:
            return _ANTHROPIC.error(exc)
        except TokentrailError as exc:
            return _ANTHROPIC.error(HTTPError(400, str(exc)))

    async def _models(self, request: web.Request) -> web.StreamResponse:
        name = self.config.model_name
        model = {
            "id": name,
            "object": "model",
            "type": "model",
            "display_name": name,
            "owned_by": "tokentrail",
            "created": 0,
            "created_at": "1970-01-01T00:00:00Z",
        }
        return web.json_response(
            {
                "object": "list",
                "data": [model],
                "has_more": False,
                "first_id": name,
                "last_id": name,
            }
        )

    async def _healthz(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"status": "ok", "engine": self.engine.name, "sessions": len(self._sessions)}
        )

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.metrics.set_open_sessions(len(self._sessions))
        payload, content_type = self.metrics.render()
        response = web.Response(body=payload)
        response.headers["Content-Type"] = content_type
        return response

    async def _root(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"name": "tokentrail"})

    def _admin(self, request: web.Request) -> None:
        token = self.config.admin_token
        if token and request.headers.get("Authorization") != f"Bearer {token}":
            raise HTTPError(401, "admin token required", "authentication_error")

    async def _finish_http(self, request: web.Request) -> web.StreamResponse:
        sid = request.match_info["sid"]
        try:
            self._admin(request)
            raw = await request.read()
            body = _parse_json(raw) if raw.strip() else {}
            reward = body.get("reward", 0.0)
            metadata = body.get("metadata") or {}
            if isinstance(reward, bool) or not isinstance(reward, int | float):
                raise HTTPError(400, "reward must be a number")
            if not isinstance(metadata, dict):
                raise HTTPError(400, "metadata must be an object")
            try:
                traj = await self.finish_trajectory(sid, reward=float(reward), metadata=metadata)
            except KeyError:
                raise HTTPError(404, f"unknown session {sid!r}", "not_found_error") from None
        except HTTPError as exc:
            return _json_error(exc)
        return web.json_response(
            {"samples": [s.to_dict() for s in traj.samples], "ledger": traj.ledger.to_dict()}
        )

    async def _drop_http(self, request: web.Request) -> web.StreamResponse:
        sid = request.match_info["sid"]
        try:
            self._admin(request)
            if not self.drop_session(sid):
                raise HTTPError(404, f"unknown session {sid!r}", "not_found_error")
        except HTTPError as exc:
            return _json_error(exc)
        return web.json_response({"dropped": sid})

    async def _close_engine(self, app: web.Application) -> None:
        await self.engine.close()

    # -- one turn -------------------------------------------------------------------------------

    async def _turn(self, request: web.Request, proto: _Protocol) -> web.StreamResponse:
        self.metrics.in_flight(+1)
        status = 499  # the client went away, unless an answer says otherwise
        try:
            response = await self._turn_inner(request, proto)
            status = response.status
            return response
        finally:
            self.metrics.in_flight(-1)
            self.metrics.request_done(proto.name, status)

    async def _turn_inner(self, request: web.Request, proto: _Protocol) -> web.StreamResponse:
        clock = _Clock()
        session: _Session | None = None
        try:
            body = await _read_json(request)
            sid = proto.session_id(request, body)
            session = self._session(sid)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise HTTPError(400, "stream must be a boolean")
            session.in_flight += 1
            session.idle.clear()
        except HTTPError as exc:
            return proto.error(exc)
        try:
            return await self._run_turn(request, proto, body, sid, session, stream, clock)
        except HTTPError as exc:
            return proto.error(exc)
        except ConnectionResetError:
            logger.debug("session %s: client went away before the reply; turn not recorded", sid)
            return web.Response(status=499)
        finally:
            session.in_flight -= 1
            if session.in_flight == 0:
                session.idle.set()

    async def _run_turn(
        self,
        request: web.Request,
        proto: _Protocol,
        body: dict[str, Any],
        sid: str,
        session: _Session,
        stream: bool,
        clock: _Clock,
    ) -> web.StreamResponse:
        try:
            translated = proto.translate(body)
            sampling = self._sampling(proto, body, session)
        except TokentrailError as exc:
            raise HTTPError(400, str(exc)) from None
        clock.lap("translate")

        restored_before = self.manager.restored_by_tool(sid)
        turn_messages = prompt_messages_for_turn(
            self.manager, sid, translated.messages, translated.tools, restore=self.config.restore
        )
        for tool, n in self.manager.restored_by_tool(sid).items():
            self.metrics.restored([tool] * (n - restored_before.get(tool, 0)))
        messages = turn_messages.record
        clock.lap("restore")
        prompt_ids, history = self._prompt_ids(sid, session, turn_messages, translated, clock)
        clock.lap("tokenize")

        limit = session.max_context_tokens or self.config.max_context_tokens
        if limit and len(prompt_ids) > limit:
            # Over the context window: answer `length` without generating; nothing to record.
            empty = {"role": "assistant", "content": ""}
            reply = proto.reply(self.config.model_name, empty, [], "length", len(prompt_ids), 0)
            return await self._respond(request, proto, reply, stream, body)

        rid = uuid.uuid4().hex
        gen_request = GenerateRequest(
            input_ids=prompt_ids,
            sampling=sampling,
            session_id=sid,
            request_id=rid,
            messages=messages,
            tools=translated.tools,
        )
        try:
            generation = await self.engine.generate(gen_request)
        except EngineError as exc:
            await self.engine.abort(rid)
            raise HTTPError(502, f"engine error: {exc}", "api_error") from None
        clock.lap("engine")

        parsed = parse_output(
            self._decode(generation.output_ids),
            tool_parser=self.config.tool_parser,
            reasoning_parser=self.config.reasoning_parser,
            tools=translated.tools,
        )
        message = parsed.message
        ids = [proto.mint_call_id() for _ in message.get("tool_calls") or ()]
        reply = proto.reply(
            self.config.model_name,
            message,
            ids,
            generation.finish_reason,
            len(prompt_ids),
            len(generation.output_ids),
        )
        clock.lap("parse")

        metadata = {
            "protocol": proto.name,
            "request_id": rid,
            "ill_formed": parsed.reason,
            "history": history,
        }
        # Journaled before the reply leaves: a crash after the client got it must not lose the
        # turn. A reply that never reaches the client retracts it again.
        seq = None
        if self.journal is not None:
            seq = self.journal.turn(
                sid,
                translated=translated.messages,
                prompt_messages=messages,
                response_message=message,
                tools=translated.tools,
                prompt_ids=prompt_ids,
                output_ids=generation.output_ids,
                logprobs=generation.logprobs,
                finish_reason=generation.finish_reason,
                ill_formed=parsed.ill_formed,
                metadata=metadata,
            )
        try:
            response = await self._respond(request, proto, reply, stream, body)
        except (ConnectionResetError, asyncio.CancelledError):
            if seq is not None and self.journal is not None:
                self.journal.retract(sid, seq)
            raise
        clock.lap("respond")

        self.manager.record_turn(
            sid,
            turn=TurnRecord(
                prompt_ids,
                generation.output_ids,
                generation.finish_reason,
                generation.logprobs,
                ill_formed=parsed.ill_formed,
            ),
            prompt_messages=messages,
            response_message=message,
            tools=translated.tools,
            metadata=metadata,
            keys=turn_messages.keys,
        )
        session.turns += 1
        clock.lap("record")
        self.metrics.observe_turn(clock.timing.stages)
        clock.timing.stages["engine_reported"] = generation.engine_time_s
        self.timings.append(clock.timing)
        return response

    def _prompt_ids(
        self,
        sid: str,
        session: _Session,
        messages: TurnMessages,
        translated: Translated,
        clock: _Clock,
    ) -> tuple[Any, str]:
        """The prompt ids, spliced onto the last generated turn's tokens when possible.

        The full render is made only when needed: a render, a fallback, or a splice whose
        tail is checked against it. That check runs for the first splice of each shape of new
        messages in a session, then every `splice_verify_every` splices.
        """
        tools = translated.tools
        every = max(1, self.config.splice_verify_every)
        checked: list[tuple[str, ...]] = []

        def verify(new: Sequence[dict[str, Any]]) -> bool:
            shape = tuple(str(m.get("role", "")) for m in new)
            if shape in session.verified and session.splices % every:
                return False
            checked.append(shape)
            return True

        def full_text() -> str:
            text = self._render(messages.render, tools)
            clock.lap("render")
            return text

        ids, label, fallback = prompt_ids_for_turn(
            self.manager,
            self.splicer,
            sid,
            messages.render,
            tools,
            session.history or self.config.history,
            full_text=full_text,
            encode=lambda text: self.encoder.encode(sid, text),
            keys=messages.keys if messages.render is messages.record else None,
            verify=verify,
        )
        if label == History.SPLICE.value:
            session.splices += 1
            session.verified.update(checked)
        if fallback is not None:
            logger.debug("session %s: splice fell back (%s)", sid, fallback)
            self.splice_fallbacks[str(fallback)] += 1
            self.metrics.splice_fallback(str(fallback))
        return ids, label

    def _sampling(
        self, proto: _Protocol, body: dict[str, Any], session: _Session
    ) -> SamplingParams:
        base = SamplingParams(max_new_tokens=self.config.default_max_tokens)
        return base.merged(session.sampling_defaults).merged(proto.sampling(body))

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        try:
            return self.splicer.render(messages, tools, add_generation_prompt=True)
        except TemplateError as exc:
            raise HTTPError(400, f"chat template rejected the messages: {exc}") from None

    def _decode(self, output_ids: list[int]) -> str:
        # The end-of-turn token is the engine's stop, not part of the message.
        end = len(output_ids)
        while end and output_ids[end - 1] in self._end_ids:
            end -= 1
        return self.tokenizer.decode(output_ids[:end])

    async def _respond(
        self,
        request: web.Request,
        proto: _Protocol,
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


# -- protocols -----------------------------------------------------------------------------------


def _bearer(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        token = auth[7:].strip()
        return token or None
    return None


class _Protocol:
    name = ""

    def session_id(self, request: web.Request, body: dict[str, Any]) -> str:
        raise NotImplementedError

    def translate(self, body: dict[str, Any]) -> Translated:
        raise NotImplementedError

    def sampling(self, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def mint_call_id(self) -> str:
        raise NotImplementedError

    def reply(
        self,
        model: str,
        message: dict[str, Any],
        ids: list[str],
        finish: str,
        prompt_tokens: int,
        output_tokens: int,
    ) -> dict[str, Any]:
        raise NotImplementedError

    def stream(self, reply: dict[str, Any], body: dict[str, Any]) -> Any:
        raise NotImplementedError

    def error(self, exc: HTTPError) -> web.Response:
        raise NotImplementedError


def _number(body: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise RequestError(
            f"{key} must be a number" if kind is not int else f"{key} must be an int"
        )
    return value


def _stops(value: object, key: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise RequestError(f"{key} must be a string or a list of strings")


def _common_sampling(body: dict[str, Any], max_key: str, stop_key: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    max_tokens = _number(body, max_key, int)
    if max_tokens is not None:
        if max_tokens < 1:
            raise RequestError(f"{max_key} must be >= 1")
        out["max_new_tokens"] = max_tokens
    for key in ("temperature", "top_p"):
        value = _number(body, key, int | float)
        if value is not None:
            out[key] = float(value)
    top_k = _number(body, "top_k", int)
    if top_k is not None:
        out["top_k"] = top_k
    stops = _stops(body.get(stop_key), stop_key)
    if stops is not None:
        out["stop"] = stops
    seed = _number(body, "seed", int)
    if seed is not None:
        out["seed"] = seed
    return out


class _AnthropicProtocol(_Protocol):
    name = "anthropic"

    def session_id(self, request: web.Request, body: dict[str, Any]) -> str:
        sid = _bearer(request) or request.headers.get("x-api-key")
        if not sid:
            raise HTTPError(
                401,
                "no session id: send it as the API key (x-api-key or Bearer)",
                "authentication_error",
            )
        return sid

    def translate(self, body: dict[str, Any]) -> Translated:
        return anthropic.translate_request(body)

    def sampling(self, body: dict[str, Any]) -> dict[str, Any]:
        return _common_sampling(body, "max_tokens", "stop_sequences")

    def mint_call_id(self) -> str:
        return mint_id("toolu_")

    def reply(
        self,
        model: str,
        message: dict[str, Any],
        ids: list[str],
        finish: str,
        prompt_tokens: int,
        output_tokens: int,
    ) -> dict[str, Any]:
        return anthropic.message_response(
            message_id=mint_id("msg_"),
            model=model,
            content=anthropic.response_content(message, ids),
            stop=anthropic.stop_reason(message, finish),
            input_tokens=prompt_tokens,
            output_tokens=output_tokens,
        )

    def stream(self, reply: dict[str, Any], body: dict[str, Any]) -> Any:
        return anthropic.stream_events(reply)

    def error(self, exc: HTTPError) -> web.Response:
        return web.json_response(
            {"type": "error", "error": {"type": exc.kind, "message": exc.message}},
            status=exc.status,
        )


class _OpenAIProtocol(_Protocol):
    name = "openai"

    def session_id(self, request: web.Request, body: dict[str, Any]) -> str:
        metadata = body.get("metadata")
        sid = metadata.get("session_id") if isinstance(metadata, dict) else None
        sid = sid or (body.get("user") if isinstance(body.get("user"), str) else None)
        sid = sid or _bearer(request)
        if not isinstance(sid, str) or not sid:
            raise HTTPError(
                401,
                "no session id: send metadata.session_id, user, or a Bearer token",
                "authentication_error",
            )
        return sid

    def translate(self, body: dict[str, Any]) -> Translated:
        return openai.translate_request(body)

    def sampling(self, body: dict[str, Any]) -> dict[str, Any]:
        key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        return _common_sampling(body, key, "stop")

    def mint_call_id(self) -> str:
        return mint_id("call_")

    def reply(
        self,
        model: str,
        message: dict[str, Any],
        ids: list[str],
        finish: str,
        prompt_tokens: int,
        output_tokens: int,
    ) -> dict[str, Any]:
        return openai.completion_response(
            response_id=mint_id("chatcmpl-"),
            created=int(time.time()),
            model=model,
            message=message,
            ids=ids,
            finish=finish,
            prompt_tokens=prompt_tokens,
            completion_tokens=output_tokens,
        )

    def stream(self, reply: dict[str, Any], body: dict[str, Any]) -> Any:
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        return openai.stream_chunks(reply, include_usage=include_usage)

    def error(self, exc: HTTPError) -> web.Response:
        return web.json_response(
            {"error": {"message": exc.message, "type": exc.kind, "code": exc.status}},
            status=exc.status,
        )


_ANTHROPIC = _AnthropicProtocol()
_OPENAI = _OpenAIProtocol()


def _json_error(exc: HTTPError) -> web.Response:
    return web.json_response(
        {"error": {"message": exc.message, "type": exc.kind}}, status=exc.status
    )


def _parse_json(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HTTPError(
            400, f"body is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise HTTPError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise HTTPError(400, f"body must be a JSON object, got {type(body).__name__}")
    return body


async def _read_json(request: web.Request) -> dict[str, Any]:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise HTTPError(413, f"request body too large: {exc.text}", "request_too_large") from None
    return _parse_json(raw)


__all__ = ["STAGES", "Adapter", "AdapterConfig", "HTTPError", "TurnTiming"]


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
