"""The pool's map of sessions: which actor each lives on, in which state, and why a lost one
was lost. It lives in the trainer's process, so it outlasts any actor's restart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from tokentrail.compat import StrEnum
from tokentrail.errors import PoolError, SessionError, SessionLost


class SessionState(StrEnum):
    OPEN = "open"
    FINISHED = "finished"
    DROPPED = "dropped"
    LOST = "lost"


@dataclass
class Placed:
    """One session of the pool: its actor, its state, and its loss once it is lost."""

    actor: int
    state: SessionState = SessionState.OPEN
    lost: SessionLost | None = None


class SessionMap:
    """Every session the pool placed, by id, in the order they were opened."""

    def __init__(self) -> None:
        self._placed: dict[str, Placed] = {}

    def get(self, sid: str) -> Placed:
        placed = self._placed.get(sid)
        if placed is None:
            raise SessionError(f"the pool has no session {sid!r}")
        return placed

    def is_open(self, sid: str) -> bool:
        placed = self._placed.get(sid)
        return placed is not None and placed.state is SessionState.OPEN

    def place(self, sid: str, actor: int) -> None:
        placed = self._placed.get(sid)
        if placed is not None and placed.state is SessionState.OPEN:
            raise PoolError(f"session {sid!r} is already open on adapter {placed.actor}")
        self._placed[sid] = Placed(actor)

    def least_loaded(self, alive: list[int]) -> int:
        """The actor of `alive` with the fewest open sessions (the lowest index on a tie)."""
        if not alive:
            raise PoolError("every adapter of the pool is gone")
        load = dict.fromkeys(alive, 0)
        for p in self._placed.values():
            if p.state is SessionState.OPEN and p.actor in load:
                load[p.actor] += 1
        return min(alive, key=lambda i: (load[i], i))

    def open_on(self, actor: int) -> list[str]:
        return [
            sid
            for sid, p in self._placed.items()
            if p.actor == actor and p.state is SessionState.OPEN
        ]

    def open_sessions(self) -> dict[str, int]:
        return {sid: p.actor for sid, p in self._placed.items() if p.state is SessionState.OPEN}

    def mark(self, sid: str, state: SessionState) -> None:
        self.get(sid).state = state

    def lose(
        self, sid: str, reason: str, detail: str, lost: Mapping[str, object] | None = None
    ) -> SessionLost:
        """Mark `sid` lost for good, with the reason a trainer reads (and, for a damaged
        journal, what of it is gone)."""
        placed = self.get(sid)
        placed.state = SessionState.LOST
        placed.lost = SessionLost(sid, reason, detail, lost)
        return placed.lost

    def lost(self) -> dict[str, SessionLost]:
        return {sid: p.lost for sid, p in self._placed.items() if p.lost is not None}

    def count(self, state: SessionState) -> int:
        return sum(1 for p in list(self._placed.values()) if p.state is state)

    def lost_by_reason(self) -> dict[str, int]:
        reasons = Counter(str(p.lost.reason) for p in list(self._placed.values()) if p.lost)
        return dict(sorted(reasons.items()))


__all__ = ["Placed", "SessionMap", "SessionState"]
