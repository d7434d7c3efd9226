"""Scale-out on Ray (`pip install tokentrail[ray]`): adapters as actors across a cluster.

`AdapterPool` places `AdapterActor`s (one HTTP adapter each, with its journal on its node's
disk), gives every session to one of them for its whole life, and brings the samples back
through Ray's object store. Ray restarts a dead actor on its node; the actor rebuilds its
unfinished sessions from its journal, and a session that cannot come back is reported lost.
"""

from __future__ import annotations

try:
    import ray  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("tokentrail.scale needs Ray: pip install 'tokentrail[ray]'") from exc

from tokentrail.scale.actor import ActorHealth, AdapterActor
from tokentrail.scale.metrics import LedgerTotals
from tokentrail.scale.pool import AdapterPool, PooledSession, PoolStats
from tokentrail.scale.spec import ActorSpec
from tokentrail.scale.transfer import FinishedBatch, FinishedSession, ShippedBatch

__all__ = [
    "ActorHealth",
    "ActorSpec",
    "AdapterActor",
    "AdapterPool",
    "FinishedBatch",
    "FinishedSession",
    "LedgerTotals",
    "PoolStats",
    "PooledSession",
    "ShippedBatch",
]
