"""Calls into a pool's actors that live through restarts, and the losses that cannot.

While Ray restarts a dead actor, calls to it fail with `ActorUnavailableError`; the
`Supervisor` waits (up to the pool's `restart_timeout_s`) and asks again. When the actor
answers from a new incarnation, the sessions its journal did not bring back are lost
(`NOT_RECOVERED`). An actor that Ray will not restart is buried: its open sessions are lost
with `ACTOR_DIED`, or `NODE_DIED` when its node is gone.

A death error is believed only when it repeats: a call that was in flight when the process
died may report the death even though Ray is about to restart the actor.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import (
    ActorUnavailableError,
    ActorUnschedulableError,
    GetTimeoutError,
    RayActorError,
)

from tokentrail.errors import PoolError, SessionLost
from tokentrail.kinds import LostReason
from tokentrail.scale import placement
from tokentrail.scale.actor import UNKNOWN, ActorHealth
from tokentrail.scale.sessions import SessionMap, SessionState
from tokentrail.scale.transfer import FinishedSession, ShippedBatch

logger = logging.getLogger(__name__)

# A Ray call an actor answers at once (health, open, drop, metrics) waits this long per try.
CALL_TIMEOUT_S = 60.0
FinishItem = tuple[str, float, dict[str, Any]]


@dataclass
class Slot:
    """One actor of the pool, as the pool last heard from it."""

    index: int
    handle: Any
    node_id: str
    journal: str
    url: str = ""
    starts: int = 0
    dead: SessionLost | None = None  # why the actor is gone for good, once it is


@dataclass
class Collected:
    """What one actor's finish call delivered, and what it could not."""

    finished: list[FinishedSession] = field(default_factory=list)
    lost: dict[str, SessionLost] = field(default_factory=dict)


class Supervisor:
    """The pool's calls into its actors, through restarts; see the module docstring."""

    def __init__(self, name: str, sessions: SessionMap, restart_timeout_s: float) -> None:
        self.name = name
        self.sessions = sessions
        self.restart_timeout_s = restart_timeout_s

    def call(self, slot: Slot, method: str, *args: Any) -> Any:
        """Call an actor, waiting through a restart. Raises `SessionLost` with the actor's
        reason once it is gone for good, or `UNAVAILABLE` if it does not come back in time."""
        deadline = time.monotonic() + self.restart_timeout_s
        delay, deaths = 0.05, 0
        while True:
            if slot.dead is not None:
                raise slot.dead
            try:
                result = ray.get(getattr(slot.handle, method).remote(*args), timeout=CALL_TIMEOUT_S)
            except ActorUnschedulableError as exc:
                self.bury(slot, exc)
                continue
            except (ActorUnavailableError, GetTimeoutError, RayActorError) as exc:
                if isinstance(exc, RayActorError) and not isinstance(exc, ActorUnavailableError):
                    deaths += 1
                    if deaths >= 2:
                        self.bury(slot, exc)
                        continue
                if time.monotonic() > deadline:
                    raise self.unavailable(slot) from None
                time.sleep(delay)
                delay = min(0.25, delay * 2)
                continue
            if isinstance(result, ActorHealth):
                self.seen(slot, result)
            return result

    def unavailable(self, slot: Slot) -> SessionLost:
        return SessionLost(
            f"<adapter {slot.index}>",
            LostReason.UNAVAILABLE,
            f"adapter {slot.index} did not answer within {self.restart_timeout_s:.0f}s",
        )

    def bury(self, slot: Slot, exc: Exception) -> None:
        """Mark an actor gone for good, and every open session on it lost."""
        gone = isinstance(exc, ActorUnschedulableError) or not placement.node_alive(slot.node_id)
        reason = LostReason.NODE_DIED if gone else LostReason.ACTOR_DIED
        lines = str(exc).strip().splitlines()
        detail = f"adapter {slot.index} on node {slot.node_id[:12]}: "
        detail += lines[0] if lines else type(exc).__name__
        slot.dead = SessionLost(f"<adapter {slot.index}>", reason, detail)
        for sid in self.sessions.open_on(slot.index):
            self.sessions.lose(sid, reason, detail)
        logger.warning(
            "pool %s: adapter %d is gone (%s): %s", self.name, slot.index, reason, detail
        )

    def seen(self, slot: Slot, health: ActorHealth) -> None:
        """Take in an actor's answer; after a restart, the sessions its journal did not bring
        back are lost."""
        restarted = slot.starts != 0 and health.starts != slot.starts
        slot.url, slot.starts = health.url, health.starts
        if not restarted:
            return
        logger.warning(
            "pool %s: adapter %d restarted (start %d), %d sessions recovered",
            self.name,
            slot.index,
            health.starts,
            len(health.recovered),
        )
        missing = [sid for sid in self.sessions.open_on(slot.index) if sid not in health.sessions]
        if not missing:
            return
        try:
            # The actor's journal says why: finished before the restart (its samples never
            # reached the pool) or not there at all.
            why = self.call(slot, "why_lost", missing)
        except SessionLost:
            why = {}
        for sid in missing:
            detail = f"adapter {slot.index} restarted and its journal {slot.journal} lacks it"
            reason, detail = why.get(sid, (LostReason.NOT_RECOVERED, detail))
            self.sessions.lose(sid, reason, detail)

    def finish(
        self, slot: Slot, ref: Any, items: list[FinishItem], accept_lost: bool = False
    ) -> Collected:
        """The outcome of one actor's finish call (`ref`, if already sent). If the actor died
        on the way, wait for its restart and finish again the sessions it brought back."""
        out = Collected()
        while True:
            pending = [item for item in items if self.sessions.is_open(item[0])]
            if not pending:
                break
            if slot.dead is not None:
                for sid, _, _ in pending:
                    self.sessions.lose(sid, slot.dead.reason, slot.dead.detail)
                break
            try:
                if ref is None:
                    ref = slot.handle.finish.remote(pending, accept_lost)
                shipped = ray.get(ref)
            except (ActorUnschedulableError, RayActorError):
                ref = None
                try:
                    self.call(slot, "health")  # waits for a restart; notes what it lost
                except SessionLost as cause:
                    if cause.reason != LostReason.UNAVAILABLE:
                        continue  # gone for good: the next round loses what is pending
                    for sid, _, _ in pending:  # not final: the sessions stay open
                        out.lost[sid] = SessionLost(sid, cause.reason, cause.detail)
                    break
                continue
            self._delivered(shipped, out)
            break
        for sid, _, _ in items:
            lost = self.sessions.get(sid).lost
            if lost is not None:
                out.lost[sid] = lost
        return out

    def _delivered(self, shipped: ShippedBatch, out: Collected) -> None:
        for sid, (reason, detail) in shipped.failures.items():
            if reason == UNKNOWN:
                raise PoolError(f"pool {self.name}: {detail}, though the pool placed it there")
            self.sessions.lose(sid, reason, detail, shipped.losses.get(sid))
        for session in shipped.unpack():
            self.sessions.mark(session.sid, SessionState.FINISHED)
            out.finished.append(session)


__all__ = ["CALL_TIMEOUT_S", "Collected", "FinishItem", "Slot", "Supervisor"]
