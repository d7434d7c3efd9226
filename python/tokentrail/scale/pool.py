"""The trainer's handle on many adapters: `AdapterPool` places adapter actors over a Ray
cluster, gives each new session to one of them, and collects the samples back.

A session goes to the least-loaded live actor when it is opened and stays there for its life:
the pool answers the base URL its harness must use, and the actor refuses turns for sessions
it was not given. `finish_many` finishes sessions on all actors at once, one Ray call per
actor, the samples coming back through the object store.

Failover (`scale.failover`): an actor that dies is restarted by Ray on its node
(`max_restarts`) and rebuilds its unfinished sessions from its journal; the pool keeps its
session map through the restart and waits for the actor to answer again. A session the pool
cannot deliver is reported lost with a `LostReason`, never returned empty.

The pool is driven from one thread; `serve_metrics`' scrapes only read it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import shutil
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from prometheus_client.metrics_core import Metric
from ray.exceptions import GetTimeoutError, RayError

from tokentrail.adapter.config import SessionSettings
from tokentrail.errors import PoolError, SessionError, SessionLost
from tokentrail.kinds import LostReason
from tokentrail.scale import metrics as pool_metrics
from tokentrail.scale import placement
from tokentrail.scale.actor import ActorHealth, AdapterActor
from tokentrail.scale.failover import CALL_TIMEOUT_S, FinishItem, Slot, Supervisor
from tokentrail.scale.sessions import SessionMap, SessionState
from tokentrail.scale.spec import ActorSpec
from tokentrail.scale.transfer import FinishedBatch, FinishedSession

logger = logging.getLogger(__name__)

DEFAULT_JOURNAL_DIR = "/tmp/tokentrail-pool"


@dataclass
class PooledSession:
    """A session placed on the pool: the base URL its harness talks to (with the session id as
    its API key), and the actor that serves it."""

    sid: str
    url: str
    actor: int


@dataclass
class PoolStats:
    """The pool as a whole: its actors now, its sessions, and the sum of delivered ledgers."""

    actors: list[ActorHealth | None]
    sessions_open: int
    sessions_finished: int
    sessions_dropped: int
    sessions_lost: dict[str, int]
    totals: pool_metrics.LedgerTotals


class AdapterPool:
    """Adapter actors over a Ray cluster, each session on exactly one of them.

    `journal_dir` is a path on every node's local disk; each actor keeps its journal at
    `<journal_dir>/<name>/adapter-<i>.db` on its own node. With `node_resource`, actors go only
    to nodes offering that custom resource and take one unit each (give each rollout node one
    unit for one adapter per node); otherwise they spread round robin over the alive nodes with
    `num_cpus` CPUs. Call `ray.init()` first.
    """

    def __init__(
        self,
        spec: ActorSpec | None = None,
        num_actors: int = 2,
        *,
        journal_dir: str | os.PathLike[str] = DEFAULT_JOURNAL_DIR,
        name: str | None = None,
        node_resource: str | None = None,
        num_cpus: float = 1,
        max_restarts: int = 3,
        max_concurrency: int = 16,
        restart_timeout_s: float = 60.0,
        start_timeout_s: float = 120.0,
    ) -> None:
        if not ray.is_initialized():
            raise PoolError("Ray is not initialized: call ray.init() before making a pool")
        spec = spec or ActorSpec()
        spec.check()
        # Harnesses know only their session id; finishing and dropping stay the pool's.
        token = spec.config.admin_token or secrets.token_urlsafe(24)
        self.spec = dataclasses.replace(
            spec, config=dataclasses.replace(spec.config, admin_token=token)
        )
        self.name = name or f"pool-{uuid.uuid4().hex[:8]}"
        self.journal_dir = Path(journal_dir) / self.name
        self._sessions = SessionMap()
        self._supervisor = Supervisor(self.name, self._sessions, restart_timeout_s)
        self._totals = pool_metrics.LedgerTotals()
        self._metrics_server: Any = None
        remote = ray.remote(AdapterActor)
        nodes = placement.spread(num_actors, placement.candidate_nodes(node_resource, num_cpus))
        self._slots: list[Slot] = []
        for i, node in enumerate(nodes):
            options = placement.actor_options(
                node,
                num_cpus=num_cpus,
                node_resource=node_resource,
                max_restarts=max_restarts,
                max_concurrency=max_concurrency,
            )
            journal = str(self.journal_dir / f"adapter-{i}.db")
            handle = remote.options(**options).remote(self.spec, i, journal)
            self._slots.append(Slot(i, handle, node, journal))
        try:
            refs = [s.handle.health.remote() for s in self._slots]
            healths = ray.get(refs, timeout=start_timeout_s)
        except GetTimeoutError:
            self.shutdown()
            raise PoolError(
                f"adapters did not start within {start_timeout_s:.0f}s: do the nodes have "
                f"{num_cpus} CPU free per actor?"
            ) from None
        except RayError as exc:
            self.shutdown()
            raise PoolError(f"an adapter failed to start: {exc}") from exc
        for slot, health in zip(self._slots, healths, strict=True):
            self._supervisor.seen(slot, health)
        logger.info("pool %s: %d adapters on %d nodes", self.name, num_actors, len(set(nodes)))

    def __enter__(self) -> AdapterPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- sessions -----------------------------------------------------------------------------

    def open_session(
        self,
        sid: str | None = None,
        settings: SessionSettings | None = None,
    ) -> PooledSession:
        """Place a new session on the least-loaded live actor and open it there (journaled),
        with its own `settings` (`SessionSettings`).

        The harness then talks to `url` with the session id as its API key; every turn of the
        session reaches that actor, and no other actor accepts it. Sessions opened with one
        `group` (a GRPO group's task) pack into one prefix tree (`FinishedBatch.pack_tree`).
        """
        sid = sid or uuid.uuid4().hex
        if self._sessions.is_open(sid):
            raise PoolError(f"session {sid!r} is already open on the pool")
        while True:
            alive = [s.index for s in self._slots if s.dead is None]
            slot = self._slots[self._sessions.least_loaded(alive)]
            try:
                slot.url = self._supervisor.call(slot, "open_session", sid, settings)
            except SessionLost as lost:
                if lost.reason == LostReason.UNAVAILABLE:
                    raise
                continue  # that actor is gone for good: place the session on another
            self._sessions.place(sid, slot.index)
            return PooledSession(sid, slot.url, slot.index)

    def url(self, sid: str) -> str:
        """The base URL of the actor serving `sid` (as of the pool's last word with it)."""
        return self._slots[self._sessions.get(sid).actor].url

    def sessions(self) -> dict[str, int]:
        """Every open session and the actor it lives on."""
        return self._sessions.open_sessions()

    def finish(
        self,
        sid: str,
        *,
        reward: float = 0.0,
        metadata: dict[str, Any] | None = None,
        accept_lost: bool = False,
    ) -> FinishedSession:
        """Finish one session: its samples and ledger. Raises `SessionLost` (with a
        `LostReason`) when the pool cannot deliver them (see `finish_many`)."""
        batch = self.finish_many(
            {sid: reward}, metadata={sid: metadata or {}}, accept_lost=accept_lost
        )
        if sid in batch.lost:
            raise batch.lost[sid]
        return batch.sessions[sid]

    def finish_many(
        self,
        rewards: Mapping[str, float] | Iterable[str],
        *,
        metadata: Mapping[str, dict[str, Any]] | None = None,
        accept_lost: bool = False,
    ) -> FinishedBatch:
        """Finish many sessions in parallel: one Ray call per actor, every actor at once, each
        finishing its sessions concurrently. `rewards` maps session ids to rewards (or lists
        ids, reward 0). Sessions the pool cannot deliver are in the result's `lost`; a session
        whose actor's journal lost some of its turns is lost as `JOURNAL_DAMAGED` (its
        `SessionLost.lost` says what is gone) unless `accept_lost`, which delivers what is
        left with the loss in its ledger and samples' metadata."""
        if not isinstance(rewards, Mapping):
            rewards = dict.fromkeys(rewards, 0.0)
        metadata = metadata or {}
        batch = FinishedBatch()
        groups: dict[int, list[FinishItem]] = {}
        for sid, reward in rewards.items():
            placed = self._sessions.get(sid)
            if placed.lost is not None:
                batch.lost[sid] = placed.lost
            elif placed.state is not SessionState.OPEN:
                raise SessionError(f"session {sid!r} was already {placed.state}")
            else:
                item = (sid, float(reward), dict(metadata.get(sid) or {}))
                groups.setdefault(placed.actor, []).append(item)
        # Every actor starts finishing before the pool waits for any.
        refs = {
            i: self._slots[i].handle.finish.remote(items, accept_lost)
            for i, items in groups.items()
            if self._slots[i].dead is None
        }
        for i, items in groups.items():
            collected = self._supervisor.finish(self._slots[i], refs.get(i), items, accept_lost)
            batch.lost.update(collected.lost)
            for session in collected.finished:
                batch.sessions[session.sid] = session
                self._totals.add(session.ledger)
        # In the caller's order, whichever actor answered first.
        batch.sessions = {sid: batch.sessions[sid] for sid in rewards if sid in batch.sessions}
        batch.lost = {sid: batch.lost[sid] for sid in rewards if sid in batch.lost}
        for lost in batch.lost.values():
            logger.warning("%s", lost)
        return batch

    def drop_session(self, sid: str) -> bool:
        """Forget a session and its turns on its actor; False if the actor no longer had it."""
        placed = self._sessions.get(sid)
        if placed.state is not SessionState.OPEN:
            return False
        placed.state = SessionState.DROPPED
        try:
            return bool(self._supervisor.call(self._slots[placed.actor], "drop_session", sid))
        except SessionLost:
            return False

    def lost(self) -> dict[str, SessionLost]:
        """Every session the pool could not deliver, with the reason."""
        return self._sessions.lost()

    # -- health and metrics ---------------------------------------------------------------------

    def check(self) -> list[ActorHealth | None]:
        """Ask every actor how it is (waiting for restarting ones); notes restarts and losses.
        None for an actor that is gone for good."""
        out: list[ActorHealth | None] = []
        for slot in self._slots:
            try:
                out.append(self._supervisor.call(slot, "health"))
            except SessionLost:
                out.append(None)
        return out

    def stats(self) -> PoolStats:
        """The actors as they answer now, the sessions by state, the delivered ledgers' sum."""
        counts = self._counts()
        return PoolStats(
            actors=self.check(),
            sessions_open=counts.sessions_open,
            sessions_finished=self._sessions.count(SessionState.FINISHED),
            sessions_dropped=self._sessions.count(SessionState.DROPPED),
            sessions_lost=counts.lost,
            totals=counts.totals,
        )

    def metrics(self) -> list[Metric]:
        """Every answering actor's series summed, then the pool's own (`tokentrail_pool_*`).

        Reads only: an actor that is restarting or gone is left out of this scrape, and
        `check` is what notes it."""
        refs = [s.handle.metrics.remote() for s in self._slots if s.dead is None]
        per_actor = []
        for ref in refs:
            try:
                per_actor.append(ray.get(ref, timeout=CALL_TIMEOUT_S))
            except RayError as exc:
                logger.debug("pool %s: an adapter missed a metrics scrape: %s", self.name, exc)
        return [*pool_metrics.summed(per_actor), *pool_metrics.pool_series(self._counts())]

    def _counts(self) -> pool_metrics.PoolCounts:
        totals = dataclasses.replace(self._totals, masked_tokens=dict(self._totals.masked_tokens))
        return pool_metrics.PoolCounts(
            actors_alive=sum(1 for s in self._slots if s.dead is None),
            actors_dead=sum(1 for s in self._slots if s.dead is not None),
            restarts=sum(max(0, s.starts - 1) for s in self._slots),
            sessions_open=self._sessions.count(SessionState.OPEN),
            lost=self._sessions.lost_by_reason(),
            totals=totals,
        )

    def serve_metrics(self, port: int = 0, addr: str = "127.0.0.1") -> str:
        """Serve `metrics()` as one Prometheus endpoint; returns its URL."""
        if self._metrics_server is None:
            self._metrics_server = pool_metrics.serve(self.metrics, port, addr)
        return f"http://{addr}:{self._metrics_server.server_port}/metrics"

    def scrape_targets(self) -> list[str]:
        """Each live actor's own `/metrics` URL, for a Prometheus that scrapes them directly."""
        return [f"{s.url}/metrics" for s in self._slots if s.dead is None]

    def actor_handle(self, index: int) -> Any:
        """The Ray handle of actor `index` (to kill it in a drill, or call it directly)."""
        return self._slots[index].handle

    def journal_of(self, index: int) -> Path:
        """Where actor `index` keeps its journal, on its node's disk."""
        return Path(self._slots[index].journal)

    def shutdown(self, *, remove_journals: bool = False) -> None:
        """Stop every actor; journals stay on the nodes' disks unless `remove_journals`
        (which removes them only where the driver shares the disk)."""
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server = None
        for slot in self._slots:
            if slot.dead is None:
                try:
                    ray.get(slot.handle.close.remote(), timeout=10)
                except RayError as exc:
                    logger.debug("adapter %d did not close cleanly: %s", slot.index, exc)
                slot.dead = SessionLost(f"<adapter {slot.index}>", LostReason.ACTOR_DIED, "shut")
            ray.kill(slot.handle, no_restart=True)
        if remove_journals:
            shutil.rmtree(self.journal_dir, ignore_errors=True)


__all__ = ["DEFAULT_JOURNAL_DIR", "AdapterPool", "PoolStats", "PooledSession"]
