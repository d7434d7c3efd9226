"""Where a pool's actors run: one node each, spread over the nodes that may hold them, and
pinned there so a restart comes back on the node whose disk holds the actor's journal.

Ray does the placing: each actor is scheduled with a hard `NodeAffinitySchedulingStrategy`, so
Ray restarts it on that node or, if the node is gone, not at all (the pool then reports its
sessions lost with `LostReason.NODE_DIED`).
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tokentrail.errors import PoolError


def candidate_nodes(node_resource: str | None = None, num_cpus: float = 1) -> list[str]:
    """The alive nodes an actor may run on: those with `num_cpus` CPUs (and `node_resource`,
    if one is named), in the order they joined the cluster."""
    nodes = [
        n
        for n in ray.nodes()
        if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= num_cpus
    ]
    if node_resource is not None:
        nodes = [n for n in nodes if n.get("Resources", {}).get(node_resource, 0) > 0]
    if not nodes:
        wanted = f" and resource {node_resource!r}" if node_resource else ""
        raise PoolError(f"no alive Ray node with {num_cpus} CPU{wanted} to place adapters on")
    return [str(n["NodeID"]) for n in nodes]


def spread(count: int, nodes: list[str]) -> list[str]:
    """The node of each of `count` actors: round robin, so no node holds two before every
    node holds one."""
    if count < 1:
        raise PoolError(f"a pool needs at least one actor, got {count}")
    return [nodes[i % len(nodes)] for i in range(count)]


def pinned(node_id: str) -> NodeAffinitySchedulingStrategy:
    """Run (and restart) only on `node_id`."""
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def node_alive(node_id: str) -> bool:
    return any(n.get("NodeID") == node_id and n.get("Alive") for n in ray.nodes())


def actor_options(
    node_id: str,
    *,
    num_cpus: float,
    node_resource: str | None,
    max_restarts: int,
    max_concurrency: int,
) -> dict[str, Any]:
    """The `ray.remote` options of one actor on `node_id`."""
    options: dict[str, Any] = {
        "num_cpus": num_cpus,
        "max_restarts": max_restarts,
        # The pool retries calls itself: it must tell a restart from a loss.
        "max_task_retries": 0,
        "max_concurrency": max_concurrency,
        "scheduling_strategy": pinned(node_id),
    }
    if node_resource is not None:
        options["resources"] = {node_resource: 1}
    return options


__all__ = ["actor_options", "candidate_nodes", "node_alive", "pinned", "spread"]
