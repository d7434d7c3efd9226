"""The HTTP adapter a harness talks to, as if it were the Anthropic or OpenAI API.

This module is the HTTP layer only: it reads a request within the admission limits
(`adapter.request.limits`), picks the protocol its route belongs to and hands the turn to
`adapter.turn.turns`, which runs it through the `TurnPipeline` around one engine call. Every
CPU-heavy step (parsing, translating, rendering, tokenizing, parsing the output, recording,
journal writes) runs off the event loop (`adapter.offload`), so `/healthz` and every other
session stay responsive while one request is heavy. A request refused before its turn is
journaled leaves no session behind; a turn is journaled and recorded before its reply leaves,
and kept whether or not the reply reaches the client: a retried request for it is answered
from the record (`adapter.turn.answers`). Errors become JSON in the protocol's shape in one
middleware (`adapter.http.middleware`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from tokentrail.adapter.config import AdapterConfig, SessionSettings
from tokentrail.adapter.http import notes as request_notes
from tokentrail.adapter.http.access_log import access_log_middleware
from tokentrail.adapter.http.admin import Admin
from tokentrail.adapter.http.connections import ConnectionGuard, GuardedSite, mark_busy
from tokentrail.adapter.http.memory import MemoryBudget
from tokentrail.adapter.http.middleware import errors_as_json, status_of
from tokentrail.adapter.metrics import Metrics
from tokentrail.adapter.offload import Offload
from tokentrail.adapter.protocols import WireProtocol, protocols
from tokentrail.adapter.protocols.fields import json_content_type
from tokentrail.adapter.request.context import model_context_length
from tokentrail.adapter.request.read import read_body
from tokentrail.adapter.request.reader import RequestReader, session_key
from tokentrail.adapter.session.damaged import refuse_unless_accepted
from tokentrail.adapter.session.sessions import Sessions, recover
from tokentrail.adapter.turn.slots import TurnSlots
from tokentrail.adapter.turn.turns import Turns, TurnSettings, replay_request
from tokentrail.engines.base import Engine
from tokentrail.errors import NotFound
from tokentrail.kinds import Stage
from tokentrail.storage.journal import Journal
from tokentrail.text.hf import HFTokenizer, as_loaded
from tokentrail.text.template_check import probe_template
from tokentrail.text.tokenizer import LoadedTokenizer
from tokentrail.text.vision import ImageCache
from tokentrail.trajectory.linearize import Trajectory
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.pipeline import TurnPipeline, TurnTiming
from tokentrail.trajectory.prompts import PromptBuilder
from tokentrail.trajectory.replay_pool import ReplayPool
from tokentrail.trajectory.sample import Sample
from tokentrail.view.app import UI_PREFIX, Viewer
from tokentrail.view.sources import LiveSource

logger = logging.getLogger(__name__)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Adapter:
    """The adapter: an aiohttp app over one engine, one tokenizer and one `TrajectoryManager`."""

    def __init__(
        self,
        *,
        engine: Engine,
        tokenizer: LoadedTokenizer | HFTokenizer,
        chat_template: str | None = None,
        manager: TrajectoryManager | None = None,
        config: AdapterConfig | None = None,
        journal: Journal | None = None,
        template_name: str | None = None,
    ) -> None:
        """`template_name` names `chat_template` where it is refused (`--chat-template FILE`)."""
        self.engine = engine
        # A `transformers` tokenizer object works as well as a loaded one (`text.hf`).
        self.tokenizer = tokenizer = as_loaded(tokenizer)
        self.config = config = config or AdapterConfig()
        self.limits = limits = config.limits
        self.manager = manager or TrajectoryManager()
        self.replay = replay_request(config, self.manager)
        template_name = template_name or ("--chat-template" if chat_template else None)
        self.pipeline = TurnPipeline(
            self.manager,
            tokenizer,
            chat_template,
            restore=config.restore,
            restore_by_id=config.restore_by_id,
            history=config.history,
            splice_verify_every=config.splice_verify_every,
            tool_parser=config.tool_parser,
            reasoning_parser=config.reasoning_parser,
            side_rules=config.side_rules(),
            template_name=template_name,
        )
        # Every render of a request's prompt runs within the budget (`text.render_budget`); a
        # tokenizer object renders its own prompts (`ObjectPrompts`), outside tokentrail's.
        if isinstance(self.pipeline.prompts, PromptBuilder):
            self.pipeline.prompts.splicer.chat.budget_s = config.render_budget_s
        probe_template(self.pipeline.render, template_name or "the chat template")
        self.metrics = Metrics()
        self.journal = journal
        self.offload = Offload(config.workers)
        image_cache = ImageCache()
        self.sessions = Sessions(
            self.pipeline,
            self.metrics,
            journal=journal,
            offload=self.offload,
            max_turns_per_session=config.max_turns_per_session,
            masked_warning_threshold=config.masked_warning_threshold,
            max_sessions=config.max_sessions,
            idle_ttl_s=config.session_idle_ttl_s,
            finish_retention_s=config.finish_retention_s,
            open_sessions_only=config.open_sessions_only,
            request_memo=config.request_memo,
            image_cache=image_cache,
        )
        self.turns = Turns(
            settings=TurnSettings(
                model_name=config.model_name,
                default_max_tokens=config.default_max_tokens,
                max_context_tokens=config.max_context_tokens,
                context_tokens=model_context_length(tokenizer),
                retry=config.retry,
                live_stream=config.live_stream,
                keepalive_s=config.keepalive_s,
            ),
            limits=limits,
            pipeline=self.pipeline,
            sessions=self.sessions,
            offload=self.offload,
            metrics=self.metrics,
            engine=engine,
            tokenizer=tokenizer,
            journal=journal,
            replay=self.replay,
        )
        self.requests = RequestReader(
            limits=limits,
            sessions=self.sessions,
            pipeline=self.pipeline,
            default_max_tokens=config.default_max_tokens,
            resume_checks=self.metrics if config.verify_resume else None,
            image_limits=config.image_limits,
            metrics=self.metrics,
            image_cache=image_cache,
        )
        # Per-stage seconds of the latest turns (benchmarks read them).
        self.timings = self.turns.timings
        self.turn_slots = TurnSlots(limits.max_concurrent_turns)
        self.memory = MemoryBudget(config.max_memory)
        if self.manager.replay_channels and self.manager.replay_pool is None:
            # The budget covers the sessions' replay rows: past its share, in files.
            spill = None if journal is None else str(journal.path.parent)  # beside the journal
            self.manager.replay_pool = ReplayPool(self.memory.replay_bytes, spill)
        self.connections = ConnectionGuard(limits.connection_cap())
        middlewares = [mark_busy(self.connections), errors_as_json]
        if config.access_log is not None:
            middlewares.insert(0, access_log_middleware(config.access_log))
        self.app = web.Application(
            client_max_size=limits.max_body_bytes or 2**62, middlewares=middlewares
        )
        admin = Admin(config.admin_token, self.sessions, self.offload, limits)
        routes = [
            web.get("/v1/models", self._models),
            # A model id may hold slashes ("Qwen/Qwen3-8B").
            web.get("/v1/models/{model:.+}", self._model),
            web.get("/healthz", self._healthz),
            web.get("/metrics", self._metrics),
            web.get("/", self._root),
            web.head("/api/hello", self._hello),
            *admin.routes(),
            # The viewer over the sessions held here, behind the admin token.
            *Viewer(LiveSource(self.manager, tokenizer), guard=admin.check).routes(UI_PREFIX),
        ]
        for proto in (p.configured(config.wire) for p in protocols()):
            routes.append(web.post(proto.turn_path, self._turn_handler(proto)))
            if proto.count_tokens_path is not None:
                routes.append(web.post(proto.count_tokens_path, self._count_handler(proto)))
        self.app.add_routes(routes)
        self.app.cleanup_ctx.append(self._sweeping)
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
                train_constrained=str(self.manager.train_constrained),
                routing=str(self.manager.routing or ""),
                indexer=str(self.manager.indexer or ""),
            )
            recover(self.sessions, journal)

    # -- sessions for trainers ------------------------------------------------------------------

    def open_session(self, sid: str, settings: SessionSettings | None = None) -> None:
        """Open (or reopen) a session with its own `settings` (`SessionSettings`)."""
        self.sessions.open(sid, settings)

    async def finish_trajectory(
        self,
        sid: str,
        *,
        reward: float = 0.0,
        metadata: dict[str, Any] | None = None,
        accept_lost: bool = False,
    ) -> Trajectory:
        """Wait for the session's in-flight turns, close it and linearize it. A session that
        lost journaled turns raises `SessionDamaged` unless `accept_lost`."""
        trajectory = await self.sessions.finish(sid, reward=reward, metadata=metadata)
        refuse_unless_accepted(sid, trajectory, accept_lost)
        return trajectory

    async def finish_session(
        self,
        sid: str,
        *,
        reward: float = 0.0,
        metadata: dict[str, Any] | None = None,
        accept_lost: bool = False,
    ) -> list[Sample]:
        trajectory = await self.finish_trajectory(
            sid, reward=reward, metadata=metadata, accept_lost=accept_lost
        )
        return trajectory.samples

    def drop_session(self, sid: str) -> bool:
        return self.sessions.drop(sid)

    # -- plain routes ---------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(models_list(self.config.model_name))

    async def _model(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's `GET /v1/models/{model}` (hermes-agent probes it at start): the served
        model; any other id is a 404 in OpenAI's error shape."""
        wanted, served = request.match_info["model"], self.config.model_name
        if wanted != served:
            raise NotFound(f"The model {wanted!r} does not exist; this server serves {served!r}")
        return web.json_response(model_object(served))

    async def _healthz(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"status": "ok", "engine": self.engine.name, "sessions": len(self.sessions)}
        )

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.metrics.set_open_sessions(len(self.sessions))
        self.metrics.set_open_connections(len(self.connections))
        if (pool := self.manager.replay_pool) is not None:
            self.metrics.set_replay_rows(pool.heap_bytes, pool.spilled_bytes)
        payload, content_type = self.metrics.render()
        return web.Response(body=payload, headers={"Content-Type": content_type})

    async def _hello(self, request: web.Request) -> web.StreamResponse:
        """Claude Code's connectivity probe (`HEAD /api/hello`, in its default configuration):
        200, no body."""
        return web.Response(status=200)

    async def _root(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"name": "tokentrail"})

    async def _sweeping(self, app: web.Application) -> AsyncIterator[None]:
        """Evict idle sessions and expire kept finishes while the app runs."""
        ttl = self.config.session_idle_ttl_s
        interval = max(1.0, min(60.0, ttl / 4)) if ttl else 60.0

        async def sweep_forever() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    await self.sessions.sweep()
                except Exception:
                    logger.exception("session sweep failed")

        task = asyncio.create_task(sweep_forever())
        yield
        task.cancel()
        self.sessions.settler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await self.offload.drain()

    async def _close_engine(self, app: web.Application) -> None:
        await self.engine.close()

    # -- protocol routes ------------------------------------------------------------------------

    def _count_handler(self, proto: WireProtocol) -> Handler:
        async def count_tokens(request: web.Request) -> web.StreamResponse:
            # A key like every other route, though a count records nothing and opens nothing.
            session_key(proto.session_id(request.headers, {}))
            json_content_type(request.headers)
            raw = await self._read(request)
            tokens = await self.offload.run(self.requests.count, proto, raw)
            return web.json_response(proto.count_tokens_reply(tokens))

        return count_tokens

    def _turn_handler(self, proto: WireProtocol) -> Handler:
        async def turn(request: web.Request) -> web.StreamResponse:
            self.metrics.in_flight(+1)
            status = 499  # the client went away, unless an answer says otherwise
            try:
                self.turn_slots.take()
                try:
                    response = await self._admitted_turn(request, proto)
                finally:
                    self.turn_slots.give()
                status = response.status
                return response
            except Exception as exc:
                status = status_of(exc, request.path)
                raise
            finally:
                self.metrics.in_flight(-1)
                self.metrics.request_done(proto.name, status)

        return turn

    async def _read(self, request: web.Request) -> bytes:
        return await read_body(
            request, max_bytes=self.limits.max_body_bytes, timeout_s=self.limits.body_timeout_s
        )

    async def _admitted_turn(self, request: web.Request, proto: WireProtocol) -> web.StreamResponse:
        timing = TurnTiming()
        sid: str | None = None
        json_content_type(request.headers)
        if not self.config.session_from_body:
            # The credential decides the session: known (and not closed) before the body is read.
            sid = session_key(proto.session_id(request.headers, {}))
            request_notes.current().session = sid
            self.sessions.check_open(sid)
            # Before the body is read: a request the memory budget has no room for costs nothing.
            self.memory.admit(request.content_length, new_session=self.sessions.get(sid) is None)
        raw = await self._read(request)
        turn = await self.offload.run(self.requests.request, proto, raw, sid, request.headers)
        request_notes.current().session = turn.sid
        if sid is None:
            self.memory.admit(len(raw), new_session=self.sessions.get(turn.sid) is None)
        timing.lap(Stage.TRANSLATE)
        session = self.sessions.admit(turn.sid)
        try:
            return await self.turns.run(request, proto, turn, session, timing)
        except ConnectionResetError:
            logger.debug(
                "session %s: client went away before the reply; turn not recorded", turn.sid
            )
            return web.Response(status=499)
        finally:
            self.sessions.release(turn.sid, session)


def model_object(name: str) -> dict[str, Any]:
    """The served model in a shape both SDKs read (OpenAI's `Model`, Anthropic's `ModelInfo`)."""
    return {
        "id": name,
        "object": "model",
        "type": "model",
        "display_name": name,
        "owned_by": "tokentrail",
        "created": 0,
        "created_at": "1970-01-01T00:00:00Z",
    }


def models_list(name: str) -> dict[str, Any]:
    """`GET /v1/models` in a shape both SDKs read: the one served model."""
    model = model_object(name)
    return {"object": "list", "data": [model], "has_more": False, "first_id": name, "last_id": name}


async def start_server(
    adapter: Adapter, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Serve `adapter` in the running loop; return the runner (to clean up) and its base URL.

    Handlers are cancelled when their client goes away, so an abandoned turn aborts its engine
    request and is never recorded. Connections pass the adapter's `ConnectionGuard`; header
    lines are held to `--max-header-bytes`, idle connections closed after
    `--idle-connection-timeout`.
    """
    runner = web.AppRunner(adapter.app, handler_cancellation=True, access_log=None)
    await runner.setup()
    limits = adapter.limits
    site = GuardedSite(
        runner,
        host,
        port,
        adapter.connections,
        keepalive_timeout=limits.idle_connection_s,
        max_line_size=limits.max_header_bytes,
        max_field_size=limits.max_header_bytes,
        # After a refusal with the body still coming (413) or stuck (408), read and discard
        # it this long so the client sees the answer, then close.
        lingering_time=2.0,
        access_log=None,
        # Bodies are decoded by `read_body`, where a bad one is a 400 on a connection that
        # lives on (aiohttp's own decoding breaks the connection and answers 500).
        auto_decompress=False,
    )
    await site.start()
    bound_host, bound_port = runner.addresses[0][:2]
    return runner, f"http://{bound_host}:{bound_port}"


def freeze_startup_heap() -> None:
    """Keep what the adapter loaded at startup (tokenizer tables, templates, parsers) out of
    every later garbage collection. A full collection walks every tracked object; over that
    heap it took 45-85 ms (a loaded 2-core machine), a pause in whatever stream it lands in:
    the p99 of the first streamed byte. Frozen objects are still freed by reference counting.
    """
    gc.collect()
    gc.freeze()


def serve_forever(adapter: Adapter, host: str, port: int, announce: Callable[[str], None]) -> None:
    """Serve until SIGINT or SIGTERM, then shut down cleanly (`tokentrail serve`)."""
    # The loop waits for the interpreter while a worker computes: it gets it back within the
    # switch interval, 5 ms by default and paid on every wake-up (a `/healthz` wakes it a few
    # times). 1 ms cuts that wait; the workers' throughput hardly notices.
    sys.setswitchinterval(0.001)

    async def main() -> None:
        runner, url = await start_server(adapter, host, port)
        freeze_startup_heap()
        announce(url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()
            adapter.offload.close()

    asyncio.run(main())


__all__ = ["Adapter", "AdapterConfig", "freeze_startup_heap", "serve_forever", "start_server"]
