"""The HTTP adapter a harness talks to, as if it were the Anthropic or OpenAI API.

This module is the HTTP layer only: the aiohttp application, its routes, and the in-process
session API trainers call. Each protocol's turn route is a `turns.TurnRoute`; errors become
JSON in the protocol's shape in one middleware (`adapter.middleware`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tokentrail.adapter.config import AdapterConfig
from tokentrail.adapter.metrics import Metrics
from tokentrail.adapter.middleware import errors_as_json
from tokentrail.adapter.protocols import WireProtocol, protocols
from tokentrail.adapter.sessions import Sessions
from tokentrail.adapter.turns import TurnRoute, parse_json, read_body, replay_request
from tokentrail.engines.base import Engine
from tokentrail.errors import (
    AuthenticationError,
    RequestError,
    SessionError,
)
from tokentrail.kinds import History
from tokentrail.storage.journal import Journal
from tokentrail.text.tokenizer import LoadedTokenizer
from tokentrail.trajectory.linearize import Trajectory
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.pipeline import TurnPipeline, TurnTiming
from tokentrail.trajectory.sample import Sample
from tokentrail.trajectory.side import SideRules

logger = logging.getLogger(__name__)

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
        self.replay = replay_request(config, self.manager)
        self.pipeline = TurnPipeline(
            self.manager,
            tokenizer,
            chat_template,
            restore=config.restore,
            history=config.history,
            splice_verify_every=config.splice_verify_every,
            tool_parser=config.tool_parser,
            reasoning_parser=config.reasoning_parser,
            side_rules=SideRules.compile(config.side_patterns()),
        )
        self.metrics = Metrics()
        self.journal = journal
        self.sessions = Sessions(
            self.pipeline,
            self.metrics,
            journal=journal,
            max_turns_per_session=config.max_turns_per_session,
            masked_warning_threshold=config.masked_warning_threshold,
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
            turn = TurnRoute(
                proto,
                engine=engine,
                pipeline=self.pipeline,
                sessions=self.sessions,
                metrics=self.metrics,
                settings=config,
                journal=journal,
                timings=self.timings,
                replay=self.replay,
            )
            routes.append(web.post(proto.turn_path, turn.handle))
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
                routing=str(self.manager.routing or ""),
                indexer=str(self.manager.indexer or ""),
            )
            self.sessions.recover(journal)

    # -- sessions for trainers ------------------------------------------------------------------

    def open_session(
        self,
        sid: str,
        sampling_defaults: dict[str, Any] | None = None,
        max_context_tokens: int = 0,
        history: History | str | None = None,
        exclude_patterns: list[str] | None = None,
    ) -> None:
        """Open (or reopen) a session; `sampling_defaults` fill what a request leaves out,
        `history` overrides the adapter's for this session, `exclude_patterns` exclude its
        side conversations (beside the adapter's own patterns)."""
        self.sessions.open(sid, sampling_defaults, max_context_tokens, history, exclude_patterns)

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
        raw = await read_body(request)
        body = parse_json(raw) if raw.strip() else {}
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
            body = parse_json(await read_body(request))
            tokens = self.pipeline.count_tokens(proto.translate(body))
            return web.json_response(proto.count_tokens_reply(tokens))

        return count_tokens


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
