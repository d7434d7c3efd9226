"""slime's `TrajectoryManager._trees`, read from tokentrail's tree: a read-only view.

slime's manager keeps each session's routing tree in `_trees[sid]`, a `MessageNode` whose
children, roles, messages, turns (`TurnRecord`s) and turn indexes slime's tests and tree dumps
read. Here the same shape is built on each access from tokentrail's `Node`s and the session's
turn store, so it always shows the tree as it stands: a generated leaf's `turn` holds the ids
and logprobs the store keeps, a node whose generated turn a rewrite took over has
`metadata["merged_rewrite"]` as slime writes it. Nothing in the view can be set.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from tokentrail.messages import Message
from tokentrail.trajectory.manager import TrajectoryManager as TrailManager
from tokentrail.trajectory.manager import turn_store
from tokentrail.trajectory.tree import Node
from tokentrail.trajectory.turn import TurnRecord

if TYPE_CHECKING:
    from tokentrail import _core


class MessageNodeView:
    """One node of a session's tree in the shape of slime's `MessageNode` (read-only)."""

    __slots__ = ("_node", "_store")

    def __init__(self, node: Node, store: _core.TurnStore) -> None:
        self._node = node
        self._store = store

    def __setattr__(self, name: str, value: Any) -> None:
        if name in MessageNodeView.__slots__ and not hasattr(self, name):
            object.__setattr__(self, name, value)
            return
        raise AttributeError(
            f"the tree is a read-only view of tokentrail's: {name!r} cannot be set (a turn's "
            "ids and logprobs are what record_turn was given)"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessageNodeView) and other._node is self._node

    def __hash__(self) -> int:
        return id(self._node)

    def __repr__(self) -> str:
        return f"MessageNodeView(role={self.role!r}, turn_index={self.turn_index!r})"

    @property
    def role(self) -> str | None:
        return self._node.role

    @property
    def message(self) -> Message | None:
        return self._node.message

    @property
    def metadata(self) -> dict[str, Any]:
        """The turn's metadata; for a node a rewrite took over, `merged_rewrite` says which
        generated turn it abandoned and how long its response was, as slime records it."""
        out = dict(self._node.metadata)
        if self._node.demoted:
            abandoned = self._node.demoted[-1]
            out["merged_rewrite"] = {
                "abandoned_turn_index": abandoned.turn_index,
                "abandoned_response_tokens": abandoned.turn.output_len,
            }
        return out

    @property
    def parent(self) -> MessageNodeView | None:
        parent = self._node.parent
        return None if parent is None else MessageNodeView(parent, self._store)

    @property
    def children(self) -> list[MessageNodeView]:
        return [MessageNodeView(child, self._store) for child in self._node.children]

    @property
    def turn(self) -> TurnRecord | None:
        """The generated turn as slime's `TurnRecord` (None for a routing-only node)."""
        stored = self._node.turn
        if stored is None:
            return None
        logprobs = self._store.logprobs(stored.id)
        return TurnRecord(
            prompt_ids=[int(t) for t in self._store.prompt_ids(stored.id)],
            output_ids=[int(t) for t in self._store.output_ids(stored.id)],
            finish_reason=stored.finish_reason,
            output_log_probs=[] if logprobs is None else [float(lp) for lp in logprobs],
            ill_formed=stored.ill_formed,
        )

    @property
    def turn_index(self) -> int | None:
        return self._node.turn_index

    @property
    def is_root(self) -> bool:
        return self._node.parent is None

    def path_from_root(self) -> list[MessageNodeView]:
        """The nodes from the first below the root down to this one."""
        return [MessageNodeView(n, self._store) for n in self._node.path()]

    def leaves(self) -> Iterator[MessageNodeView]:
        """The leaves under this node, depth first in insertion order (this node if it has no
        children)."""
        stack = [self._node]
        while stack:
            node = stack.pop()
            if not node.children:
                yield MessageNodeView(node, self._store)
            stack.extend(reversed(node.children))


class TreesView(Mapping[str, MessageNodeView]):
    """Every session's tree by session id, as slime's `_trees` maps them (read-only)."""

    def __init__(self, core: TrailManager) -> None:
        self._core = core

    def __getitem__(self, sid: str) -> MessageNodeView:
        if not self._core.has_session(sid):
            raise KeyError(sid)
        return MessageNodeView(self._core.root(sid), turn_store(self._core, sid))

    def __iter__(self) -> Iterator[str]:
        return iter(self._core.sessions())

    def __len__(self) -> int:
        return len(self._core.sessions())


__all__ = ["MessageNodeView", "TreesView"]
