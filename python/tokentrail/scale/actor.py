"""One adapter of a pool, as a Ray actor: HTTP for the harnesses, Ray calls for the trainer.

The actor serves the ordinary HTTP adapter on its node and keeps its journal on that node's
disk. The adapter runs on an event loop of its own, on a thread of the actor, so the HTTP
server keeps serving between Ray calls; every Ray call runs its work on that loop.

When Ray restarts a dead actor it runs the constructor again with the same arguments: the
adapter reopens the same journal, rebuilds the unfinished sessions from it, and binds the port
the previous incarnation used (kept in a small state file next to the journal), so a harness
that retries its request reaches the restarted adapter at the URL it already has.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import ray
from aiohttp import web
from prometheus_client.metrics_core import Metric

from tokentrail.adapter import Adapter, start_server
from tokentrail.adapter.config import SessionSettings
from tokentrail.errors import SessionClosed, SessionDamaged, SessionError
from tokentrail.kinds import JournalState, LostReason
from tokentrail.scale.spec import ActorSpec
from tokentrail.scale.transfer import ShippedBatch
from tokentrail.trajectory.linearize import Trajectory

logger = logging.getLogger(__name__)

T = TypeVar("T")
# What an actor answers for a session it cannot finish and no journal explains: the pool's
# map and the actor disagree, which only a bug can cause.
UNKNOWN = "unknown"


@dataclass
class ActorHealth:
    """One actor as it answers now: where it serves, which incarnation, which sessions."""

    index: int
    url: str
    node_id: str
    pid: int
    # 1 for the first start; Ray's restarts count up from there.
    starts: int
    # Open sessions and the turns each has recorded (those rebuilt from the journal included).
    sessions: dict[str, int] = field(default_factory=dict)
    # Sessions this incarnation rebuilt from its journal when it started.
    recovered: list[str] = field(default_factory=list)
    # Seconds this incarnation took to start: load, recover from the journal, bind.
    startup_s: float = 0.0
    engine: str = ""


def state_path(journal_path: Path) -> Path:
    """The file beside a journal that remembers the actor's port and how often it started."""
    return journal_path.with_name(journal_path.name + ".actor.json")


class AdapterActor:
    """An adapter on one node. The pool wraps this class with `ray.remote` and its options."""

    def __init__(self, spec: ActorSpec, index: int, journal_path: str) -> None:
        started = time.perf_counter()
        self.index = index
        self.journal_path = Path(journal_path)
        self.journal_path.parent.mkdir(parents=True, exist_ok=True)
        state = self._read_state()
        self.starts = int(state.get("starts", 0)) + 1
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"tokentrail-adapter-{index}", daemon=True
        )
        self._thread.start()
        self.adapter: Adapter = self._run(self._build(spec))
        self.recovered = self._on_loop(self.adapter.sessions.open_ids)
        host = spec.host or ray.util.get_node_ip_address()
        self._runner, self.url = self._run(self._serve(host, int(state.get("port", 0))))
        self._write_state(port=int(self.url.rsplit(":", 1)[1]), starts=self.starts)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.startup_s = time.perf_counter() - started
        logger.info(
            "adapter %d (start %d) serving on %s after %.2fs, %d sessions recovered from %s",
            index,
            self.starts,
            self.url,
            self.startup_s,
            len(self.recovered),
            self.journal_path,
        )

    # -- the adapter's loop -----------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _on_loop(self, fn: Callable[..., T], *args: Any) -> T:
        async def call() -> T:
            return fn(*args)

        return self._run(call())

    async def _build(self, spec: ActorSpec) -> Adapter:
        return spec.build(self.journal_path)

    async def _serve(self, host: str, port: int) -> tuple[web.AppRunner, str]:
        if port:
            try:
                return await start_server(self.adapter, host, port)
            except OSError as exc:
                logger.warning(
                    "adapter %d: port %d is taken (%s); serving on a new port, harnesses must "
                    "ask the pool for the new URL",
                    self.index,
                    port,
                    exc,
                )
        return await start_server(self.adapter, host, 0)

    # -- the state file -----------------------------------------------------------------------

    def _read_state(self) -> dict[str, Any]:
        path = state_path(self.journal_path)
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def _write_state(self, **state: Any) -> None:
        path = state_path(self.journal_path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, path)

    # -- Ray calls ----------------------------------------------------------------------------

    def health(self) -> ActorHealth:
        return self._on_loop(self._health)

    def _health(self) -> ActorHealth:
        sessions = self.adapter.sessions
        turns = {}
        for sid in sessions.open_ids():
            session = sessions.get(sid)
            turns[sid] = session.turns if session is not None else 0
        return ActorHealth(
            index=self.index,
            url=self.url,
            node_id=self.node_id,
            pid=os.getpid(),
            starts=self.starts,
            sessions=turns,
            recovered=list(self.recovered),
            startup_s=self.startup_s,
            engine=self.adapter.engine.name,
        )

    def open_session(self, sid: str, settings: SessionSettings | None = None) -> str:
        """Open a session (journaled); returns the base URL its harness talks to."""
        self._on_loop(self.adapter.open_session, sid, settings)
        return self.url

    def finish(
        self, items: list[tuple[str, float, dict[str, Any]]], accept_lost: bool = False
    ) -> ShippedBatch:
        """Finish the sessions of `items` (sid, reward, metadata) concurrently; their samples
        come back as one batch of columns, through the object store. A session that lost
        journaled turns is a failure (`JOURNAL_DAMAGED`, with what it lost) unless
        `accept_lost`."""
        return self._run(self._finish(items, accept_lost))

    async def _finish(
        self, items: list[tuple[str, float, dict[str, Any]]], accept_lost: bool
    ) -> ShippedBatch:
        async def one(sid: str, reward: float, metadata: dict[str, Any]) -> Trajectory:
            return await self.adapter.finish_trajectory(
                sid, reward=reward, metadata=metadata, accept_lost=accept_lost
            )

        results = await asyncio.gather(*(one(*item) for item in items), return_exceptions=True)
        finished: dict[str, Trajectory] = {}
        failures: dict[str, tuple[str, str]] = {}
        losses: dict[str, Mapping[str, object]] = {}
        for (sid, _, _), result in zip(items, results, strict=True):
            if isinstance(result, Trajectory):
                finished[sid] = result
            elif isinstance(result, SessionDamaged):
                failures[sid] = (LostReason.JOURNAL_DAMAGED, f"adapter {self.index}: {result}")
                losses[sid] = result.lost
            elif isinstance(result, SessionError | SessionClosed):
                failures[sid] = self._why_unknown(sid)
            else:
                raise result
        return ShippedBatch.of(self.index, finished, failures, losses)

    def why_lost(self, sids: list[str]) -> dict[str, tuple[str, str]]:
        """Why this adapter has none of `sids` open: the reason (`LostReason`) and a detail."""
        return {sid: self._on_loop(self._why_unknown, sid) for sid in sids}

    def _why_unknown(self, sid: str) -> tuple[str, str]:
        # A session the journal shows finished, yet the pool asks again: its samples were lost
        # on the way (the actor died after journaling the finish, or they are past retention).
        journal = self.adapter.journal
        ended = None if journal is None else journal.ended(sid)
        if ended == JournalState.FINISHED:
            return (
                LostReason.FINISH_LOST,
                f"adapter {self.index} finished it, but its samples never reached the pool "
                f"(the journal {self.journal_path} records the finish)",
            )
        if ended == JournalState.DROPPED:
            return LostReason.NOT_RECOVERED, f"dropped before adapter {self.index} restarted"
        if self.starts > 1:
            return (
                LostReason.NOT_RECOVERED,
                f"adapter {self.index} restarted (start {self.starts}) and its journal "
                f"{self.journal_path} does not hold the session",
            )
        return UNKNOWN, f"adapter {self.index} has no session {sid!r}"

    def drop_session(self, sid: str) -> bool:
        return self._on_loop(self.adapter.drop_session, sid)

    def metrics(self) -> list[Metric]:
        """Every series of this adapter's registry, as `/metrics` would answer now."""
        return self._on_loop(self._metrics)

    def _metrics(self) -> list[Metric]:
        metrics = self.adapter.metrics
        metrics.set_open_sessions(len(self.adapter.sessions))
        return list(metrics.registry.collect())

    def close(self) -> None:
        """Stop serving and close the journal; the actor can then be killed."""
        self._run(self._runner.cleanup())
        if self.adapter.journal is not None:
            self._on_loop(self.adapter.journal.close)
        self._loop.call_soon_threadsafe(self._loop.stop)


__all__ = ["UNKNOWN", "ActorHealth", "AdapterActor", "state_path"]
