"""The sessions an adapter recovered from its journal with turns missing, and what each lost.

A lost WAL tail, a damaged page, a turn that cannot be recorded again: recovery notes each as a
`LostSpan` of its session, and its finish's ledger and samples carry them. A finish asked
without `accept_lost` is then refused (`refuse_unless_accepted` raises `SessionDamaged`, HTTP
409, stating the loss); one with it returns what is left. The admin API lists every such
session since the start, open or closed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tokentrail.errors import SessionDamaged
from tokentrail.trajectory.linearize import Trajectory
from tokentrail.trajectory.lost import LostSpan, describe, summary


class DamagedSessions:
    """What each recovered session lost, by id (kept after it closes, for the listing)."""

    def __init__(self) -> None:
        self._lost: dict[str, list[LostSpan]] = {}

    def __len__(self) -> int:
        return len(self._lost)

    def note(self, sid: str, span: LostSpan) -> None:
        self._lost.setdefault(sid, []).append(span)

    def of(self, sid: str) -> Sequence[LostSpan]:
        return self._lost.get(sid, ())

    def listing(self, state: Callable[[str], str]) -> list[dict[str, Any]]:
        """Each session: its id, its `state` ("open", or how it closed), and what it lost (as
        a finish answer's `lost` states it)."""
        return [
            {"session": sid, "state": state(sid), "lost": summary(spans)}
            for sid, spans in self._lost.items()
        ]


def refuse_unless_accepted(sid: str, trajectory: Trajectory, accept_lost: bool) -> None:
    """Raise `SessionDamaged` for a session that lost turns, unless `accept_lost`."""
    spans = trajectory.ledger.lost
    if spans and not accept_lost:
        raise SessionDamaged(
            sid,
            f"{describe(sid, spans)}; finish it with accept_lost to get what is left",
            summary(spans) or {},
            trajectory.ledger.to_dict(),
        )
