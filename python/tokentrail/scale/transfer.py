"""Finished sessions on their way from an actor to the trainer, through Ray's object store.

An actor returns one `ShippedBatch` per finish call: every sample of every session it finished,
as a handful of flat numpy columns (`storage.export.sample_columns`) plus a small record per
session. Ray stores numpy buffers out of band, so the trainer's `ray.get` maps them read-only
from shared memory: the samples it unpacks are views of those columns, never copies.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from tokentrail.errors import SessionLost
from tokentrail.storage.export import (
    PackedBatch,
    pack_samples,
    sample_columns,
    samples_from_columns,
)
from tokentrail.storage.tree_pack import TreePack, pack_tree
from tokentrail.trajectory.ledger import Ledger, LedgerJson
from tokentrail.trajectory.manager import Trajectory
from tokentrail.trajectory.sample import Sample

logger = logging.getLogger(__name__)


@dataclass
class ShippedSession:
    """One session of a `ShippedBatch`: where its samples sit in the columns, and its ledger."""

    sid: str
    first: int
    count: int
    ledger: LedgerJson


@dataclass
class ShippedBatch:
    """What one actor's finish call returns: its finished sessions' samples as columns, and
    the sessions it could not finish, each with the reason (`LostReason`) and a detail, and for
    those that lost journaled turns, what they lost."""

    actor: int
    columns: dict[str, np.ndarray]
    sessions: list[ShippedSession] = field(default_factory=list)
    failures: dict[str, tuple[str, str]] = field(default_factory=dict)
    losses: dict[str, Mapping[str, object]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        actor: int,
        finished: dict[str, Trajectory],
        failures: dict[str, tuple[str, str]] | None = None,
        losses: dict[str, Mapping[str, object]] | None = None,
    ) -> ShippedBatch:
        samples: list[Sample] = []
        sessions = []
        for sid, trajectory in finished.items():
            sessions.append(
                ShippedSession(
                    sid, len(samples), len(trajectory.samples), trajectory.ledger.to_dict()
                )
            )
            samples.extend(trajectory.samples)
        return cls(
            actor, sample_columns(samples), sessions, dict(failures or {}), dict(losses or {})
        )

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.columns.values())

    def unpack(self) -> Iterator[FinishedSession]:
        """The finished sessions; their samples' arrays are views of this batch's columns."""
        samples = samples_from_columns(self.columns, where=f"actor {self.actor}'s batch")
        for s in self.sessions:
            ledger = Ledger.from_dict(s.ledger)
            yield FinishedSession(s.sid, samples[s.first : s.first + s.count], ledger, self.actor)


@dataclass
class FinishedSession:
    """A session the pool finished: its training samples, its ledger, the actor that served it."""

    sid: str
    samples: list[Sample]
    ledger: Ledger
    actor: int


@dataclass
class FinishedBatch:
    """The result of `AdapterPool.finish_many`: the finished sessions, in the order asked, and
    the lost ones, each with its `SessionLost` (whose `reason` says why)."""

    sessions: dict[str, FinishedSession] = field(default_factory=dict)
    lost: dict[str, SessionLost] = field(default_factory=dict)

    def samples(self) -> list[Sample]:
        return [sample for session in self.sessions.values() for sample in session.samples]

    def ledger(self) -> Ledger:
        """Every finished session's turns in one ledger (the pool-wide account of this batch)."""
        total = Ledger()
        for session in self.sessions.values():
            total.turns.extend(session.ledger.turns)
            total.restored_echoes += session.ledger.restored_echoes
            for tool, n in session.ledger.restored_by_tool.items():
                total.restored_by_tool[tool] = total.restored_by_tool.get(tool, 0) + n
            total.lost.extend(session.ledger.lost)
        return total

    def pack(self, backend: str | None = None) -> PackedBatch:
        """Every finished sample packed for variable-length attention (`pack_samples`)."""
        return pack_samples(self.samples(), backend=backend)

    def pack_tree(self) -> TreePack:
        """Every finished sample packed as one prefix tree per group (`pack_tree`)."""
        return pack_tree(self.samples())


__all__ = ["FinishedBatch", "FinishedSession", "ShippedBatch", "ShippedSession"]
