"""One session's state in a `TrajectoryManager`: its message tree, its turn store (and its
replay rows, when a `ReplayPool` holds them), its echo restore, and what the next turn's walk
and lookups reuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokentrail.core.ids import RowArray, TokenIds
from tokentrail.core.routing import IndexerShape, ReplayRows, RoutingShape
from tokentrail.kinds import Replay
from tokentrail.messages import Message, tool_names
from tokentrail.trajectory.replay_pool import (
    NUMBERED_INDEXER,
    NUMBERED_ROUTING,
    ReplayArgs,
    ReplayPool,
    SessionRows,
)
from tokentrail.trajectory.restore import EchoRestorer
from tokentrail.trajectory.sample import RowRead, store_rows
from tokentrail.trajectory.tags import TurnTags
from tokentrail.trajectory.tree import MessageKey, Node, WalkMemo
from tokentrail.trajectory.turn import CheckedTurn, StoredTurn

if TYPE_CHECKING:
    from tokentrail import _core
    from tokentrail.core.backend import Core


@dataclass(frozen=True)
class SpliceAnchor:
    """The generated turn a splice continues: its tokens, its message, and its position."""

    prompt_ids: TokenIds
    output_ids: TokenIds
    finish_reason: str | None
    message: Message
    index: int


@dataclass
class SessionState:
    """One session of a `TrajectoryManager`: its tree, its turn store (and its pooled replay
    rows), its echo restore, and what lookups and the next walk of its tree reuse."""

    store: _core.TurnStore  # the backend's TurnStore: every turn's tokens, stored compactly
    root: Node = field(default_factory=Node)
    turns: int = 0
    # Its echo restore: what it recognized, restored and counted (`trajectory.restore`).
    echoes: EchoRestorer = field(default_factory=EchoRestorer)
    # The node holding each generated turn, by turn index.
    by_index: dict[int, Node] = field(default_factory=dict)
    # The nodes of the generated turns tagged with each reply id (one, as ids are minted per
    # reply), in the order they were recorded: `find_reply` without a walk of the tree.
    by_reply: dict[str, list[Node]] = field(default_factory=dict)
    # Moves whenever recording changes what an earlier walk of the tree found: a rewrite
    # rekeyed a node, or a node that had children got another (`tree.WalkMemo`).
    shape: int = 0
    # The last exact walk of the tree, which the next one continues from.
    walked: WalkMemo = field(default_factory=lambda: WalkMemo([], [], 0))
    # Each generated turn's tags as read when it was recorded, with the metadata they were
    # read from (by store id): finish reads them rather than every turn's metadata again.
    tags: dict[int, tuple[Mapping[str, Any], TurnTags]] = field(default_factory=dict)
    # Likewise, the names of each generated message's tool calls, with that message.
    tools: dict[int, tuple[object, tuple[str, ...]]] = field(default_factory=dict)
    # Its replay rows, when the manager pools them (`replay_pool`): the store's tapes then
    # hold row numbers.
    rows: SessionRows | None = None

    def mounting(self, walked: Node, at: Node) -> None:
        """A turn is about to be mounted at `at`, where a walk ended at `walked`: a rewrite
        rekeyed a node (`at` is another), or a node that has children gets another: what an
        earlier walk found may now go otherwise."""
        if at is not walked or at.children:
            self.shape += 1

    def walk(self, keys: list[MessageKey]) -> tuple[Node, int]:
        """`tree.walk` from the root, taking the last walk's nodes for the keys it shares."""
        nodes = self.walked.walk(self.root, keys, self.shape)
        return (nodes[-1] if nodes else self.root), len(nodes)

    def push(self, parent: int, turn: CheckedTurn) -> int:
        """Store the turn under `parent` (its rows in the pool, if pooled); its store id."""
        replay = self._replay_args(parent, turn)
        undo = None if self.rows is None else self.rows.keep(replay)
        try:
            return self.store.push(
                parent,
                turn.prompt_ids,
                turn.output_ids,
                turn.logprobs,
                routed_experts=replay[Replay.ROUTED_EXPERTS][0],
                indexer_topk=replay[Replay.INDEXER_TOPK][0],
            )
        except BaseException:
            if undo is not None:
                undo()
            raise

    def release(self) -> None:
        """Give its pooled rows back (the session is gone)."""
        if self.rows is not None:
            self.rows.close()

    def add_turn(self, leaf: Node) -> None:
        self.by_index[self.turns] = leaf
        tags = TurnTags.read(leaf.metadata)
        if leaf.turn is not None:
            self.tags[leaf.turn.id] = (leaf.metadata, tags)
            message = leaf.message
            self.tools[leaf.turn.id] = (message, tuple(tool_names(message)))
        reply_id = tags.reply_id
        if isinstance(reply_id, str):
            self.by_reply.setdefault(reply_id, []).append(leaf)

    def reply(self, reply_id: str) -> Node | None:
        """The generated turn whose reply had this id (a turn a rewrite demoted is none)."""
        return next((n for n in self.by_reply.get(reply_id, ()) if n.turn is not None), None)

    def anchor(self, keys: list[MessageKey]) -> SpliceAnchor | None:
        """`TrajectoryManager.splice_anchor` of the messages with these keys."""
        found = self.last_generated(keys)
        if found is None:
            return None
        turn, message, at = found
        ids = (self.store.prompt_ids(turn.id), self.store.output_ids(turn.id))
        return SpliceAnchor(*ids, turn.finish_reason, message, at)

    def replay_start(self, keys: list[MessageKey], ids: TokenIds) -> int:
        """`TrajectoryManager.replay_start` of the messages with these keys."""
        # `record_turn` files the turn under this generated ancestor: a rewrite merge demotes
        # the leaf it continues through, so it finds the same one.
        parent = store_id(self.walk(keys)[0].generated_ancestor())
        return self.store.replay_start(parent, ids)

    def row_reader(self) -> RowRead:
        """How a linearization reads the session's rows: from its store, or through its pool."""
        rows = self.rows
        return store_rows(self.store) if rows is None else rows.reader(self.store)

    def _replay_args(self, parent: int, turn: CheckedTurn) -> ReplayArgs:
        """Per channel, what the store is given for the turn, and what the pool keeps after."""
        if self.rows is not None:
            return self.rows.store_args(self.store, parent, turn)
        given = {Replay.ROUTED_EXPERTS: turn.routed_experts, Replay.INDEXER_TOPK: turn.indexer_topk}
        return {channel: (_replay_arg(g), None) for channel, g in given.items()}

    def last_generated(self, keys: list[MessageKey]) -> tuple[StoredTurn, Message, int] | None:
        """The last generated turn on the exact path of `keys`: its turn, message and position
        (found from the path's end up: a late turn's anchor is a few messages back)."""
        nodes = self.walked.walk(self.root, keys, self.shape)
        for i in range(len(nodes) - 1, -1, -1):
            node = nodes[i]
            if node.turn is not None:
                message = node.message
                if message is not None:
                    return node.turn, message, i
        return None


def open_session(
    core: Core, routing: RoutingShape | None, indexer: IndexerShape | None, pool: ReplayPool | None
) -> SessionState:
    """A session whose store keeps the manager's replay tapes: the rows, or with a pool their
    numbers."""
    numbered = pool is not None
    store = core.TurnStore(
        routed_experts=None if routing is None else NUMBERED_ROUTING if numbered else routing.dims,
        indexer_topk=None if indexer is None else NUMBERED_INDEXER if numbered else indexer.dims,
    )
    return SessionState(store, rows=None if pool is None else pool.open(routing, indexer))


def store_id(node: Node | None) -> int:
    """The store id of a generated turn's node, -1 for none."""
    return node.turn.id if node is not None and node.turn is not None else -1


def _replay_arg(rows: ReplayRows | None) -> str | tuple[int, RowArray] | None:
    return None if rows is None else rows.store_arg()
