"""`TrajectoryManager`: routes each recorded turn into its session's tree and, at the end,
linearizes the tree into loss-masked samples with a ledger of every generated token.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from tokentrail.core.backend import load_backend
from tokentrail.core.ids import TokenIds
from tokentrail.core.routing import IndexerShape, RoutingShape
from tokentrail.errors import MessageError, PolicyError, SessionError
from tokentrail.kinds import (
    Backend,
    ConstrainedPolicy,
    DriftPolicy,
    Replay,
    RewritePolicy,
    parse_kind,
)
from tokentrail.messages import Message, ToolSchema
from tokentrail.trajectory import retry
from tokentrail.trajectory.ledger import Ledger
from tokentrail.trajectory.linearize import Trajectory as Trajectory  # what reads return
from tokentrail.trajectory.linearize import linearize_session
from tokentrail.trajectory.policies import DEFAULT_POLICIES
from tokentrail.trajectory.replay_pool import (
    ReplayPool,
)
from tokentrail.trajectory.restore import EchoRestorer
from tokentrail.trajectory.rewrite import merge_rewrite
from tokentrail.trajectory.sample import Sample
from tokentrail.trajectory.session_state import SessionState, SpliceAnchor, open_session, store_id
from tokentrail.trajectory.tree import MessageKey, Node, iter_nodes, message_key
from tokentrail.trajectory.turn import CheckedTurn, StoredTurn, TurnRecord, validate_turn

if TYPE_CHECKING:
    from tokentrail import _core

logger = logging.getLogger(__name__)
# A generated turn's conversation (prompt messages, then its response) and its metadata.
FoundTurn = tuple[list[Message], dict[str, Any]]
P = TypeVar("P", DriftPolicy, RewritePolicy, ConstrainedPolicy)

T = TypeVar("T")
# What reads a session as it stands: its tree, its turn store, its linearization and its echo
# restore (read them, do not change them).
SessionReader = Callable[[Node, "_core.TurnStore", Trajectory, EchoRestorer], T]


def _policy(kind: type[P], value: object, what: str) -> P:
    return parse_kind(kind, value, what, PolicyError)


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError(f"{what} must be an int")
    if value < 0:
        raise PolicyError(f"{what} must be >= 0, got {value}")
    return value


class TrajectoryManager:
    """Per-session message trees of recorded turns, linearized into training samples.

    With `routing` (a MoE's `RoutingShape`) or `indexer` (an `IndexerShape`), each session's
    store keeps those replay rows and every sample carries them, aligned with its tokens.
    With `replay_memory` (bytes), a `ReplayPool` holds them (`replay_pool`; files in `replay_dir`).

    Every public method takes the manager's lock, so concurrent rollout threads may share one.
    """

    def __init__(
        self,
        *,
        fork_threshold_tokens: int = DEFAULT_POLICIES.fork_threshold_tokens,
        drift_policy: DriftPolicy | str = DEFAULT_POLICIES.drift_policy,
        rewrite_policy: RewritePolicy | str = DEFAULT_POLICIES.rewrite_policy,
        backend: Backend | str | None = None,
        routing: RoutingShape | None = None,
        indexer: IndexerShape | None = None,
        train_superseded: bool = False,
        train_constrained: ConstrainedPolicy | str = DEFAULT_POLICIES.train_constrained,
        replay_memory: int | None = None,
        replay_dir: str | None = None,
    ) -> None:
        self.drift_policy = _policy(DriftPolicy, drift_policy, "drift policy")
        self.rewrite_policy = _policy(RewritePolicy, rewrite_policy, "rewrite policy")
        self.fork_threshold_tokens = _count(fork_threshold_tokens, "fork_threshold_tokens")
        self.routing, self.indexer = routing, indexer
        self.replay_channels = _channels(routing, indexer)  # what every session keeps
        # A superseded generation (see `record_turn`) is masked as `superseded` unless this is
        # set: then it trains as a dead-end sample of its own, as any other leaf would.
        self.train_superseded = bool(train_superseded)
        # Tokens sampled under a grammar (a forced tool call) are masked as `constrained`
        # unless this is `yes`; they are marked in their samples either way.
        self.train_constrained = _policy(ConstrainedPolicy, train_constrained, "constrained policy")
        self.core = load_backend(backend)
        pooled = replay_memory is not None and self.replay_channels
        self.replay_pool = ReplayPool(replay_memory or 0, replay_dir) if pooled else None
        self._sessions: dict[str, SessionState] = {}
        self._lock = threading.RLock()

    # -- sessions -----------------------------------------------------------------------------

    def has_session(self, sid: str) -> bool:
        return sid in self._sessions

    def turn_count(self, sid: str) -> int:
        session = self._sessions.get(sid)
        return session.turns if session else 0

    def drop_session(self, sid: str) -> bool:
        with self._lock:
            session = self._sessions.pop(sid, None)
        if session is not None:
            session.release()
        return session is not None

    def sessions(self) -> list[str]:
        return list(self._sessions)

    def root(self, sid: str) -> Node:
        """The session's tree (read it, do not change it)."""
        session = self._sessions.get(sid)
        if session is None:
            raise SessionError(f"no session {sid!r}")
        return session.root

    # -- recording ----------------------------------------------------------------------------

    def record_turn(
        self,
        sid: str,
        *,
        turn: TurnRecord,
        prompt_messages: Sequence[Message],
        response_message: Message | None,
        metadata: dict[str, Any] | None = None,
        tools: list[ToolSchema] | None = None,
        keys: list[MessageKey] | None = None,
        supersede: bool = False,
    ) -> int:
        """Route one turn into the session's tree; return its turn index (1-based).

        Everything is validated before the tree changes, so a bad turn leaves it as it was.
        `keys` are the messages' routing keys if the caller already has them (`restore_keyed`).
        An empty `prompt_messages` is refused: a turn needs a prompt to route by.

        With `supersede`, the turn replaces the earlier turns generated from the same prompt
        (same path, same prompt ids) that nothing was built on (`unanswered_turns`): the
        harness asked again and got a fresh answer, and they are masked as `superseded`.
        """
        _check_sid(sid)
        keys = _checked_keys(prompt_messages, keys, "prompt_messages")
        response_key = _response_key(response_message)
        checked = validate_turn(turn)
        if not keys:
            raise MessageError("prompt_messages must not be empty")

        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                session = self._sessions[sid] = open_session(
                    self.core, self.routing, self.indexer, self.replay_pool
                )
            node, i = session.walk(keys)
            if supersede and i == len(keys):
                retry.supersede(
                    retry.unanswered(node, checked.prompt_ids, session.store.prompt_ids)
                )
            walked = node
            node, i = merge_rewrite(
                self.rewrite_policy, self.fork_threshold_tokens, node, prompt_messages, keys, i
            )
            session.mounting(walked, node)
            # The prompt continues the nearest generated turn above it: its tokens are stored
            # as the prefix shared with that turn plus a tail.
            stored = session.push(store_id(node.generated_ancestor()), checked)
            for message, key in zip(prompt_messages[i:], keys[i:], strict=True):
                node = node.add_child(Node(message, key=key, keep_message=False))
            session.turns += 1
            leaf = _generated_leaf(response_message, response_key, stored, checked)
            leaf.turn_index, leaf.tools = session.turns, tools
            if metadata:
                leaf.metadata = dict(metadata)
            node.add_child(leaf)
            session.add_turn(leaf)
            return session.turns

    # -- retries ------------------------------------------------------------------------------

    def unanswered_turns(
        self,
        sid: str,
        prompt_messages: Sequence[Message],
        prompt_ids: TokenIds,
        keys: list[MessageKey] | None = None,
    ) -> list[int]:
        """Turns a request with this prompt repeats (see `trajectory.retry`), latest first."""
        keys = _checked_keys(prompt_messages, keys, "prompt_messages")
        prompt = np.asarray(prompt_ids, dtype=np.uint32)
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                return []
            node, i = session.walk(keys)
            found = (
                retry.unanswered(node, prompt, session.store.prompt_ids) if i == len(keys) else []
            )
            return sorted((n.turn_index or 0 for n in found), reverse=True)

    def answered_again(self, sid: str, turn_index: int) -> None:
        """Count one retried request answered with this turn's recorded reply."""
        with self._lock:
            session = self._sessions.get(sid)
            node = session.by_index.get(turn_index) if session is not None else None
            if node is None or node.turn is None:
                raise SessionError(f"session {sid!r} has no generated turn {turn_index}")
            retry.answered_again(node)

    # -- echo restore -------------------------------------------------------------------------

    def restore_generated_messages(
        self,
        sid: str,
        messages: list[Message],
        tools: list[ToolSchema] | None = None,
    ) -> list[Message]:
        """Every recognized echo of a generated message replaced with the message we stored
        (see `tokentrail.trajectory.restore`), in a new list; the caller's are left alone."""
        restored, _, _ = self.restore_keyed(sid, messages, tools)  # the tree's own dicts: copy
        return [
            m if m is given else copy.deepcopy(m)
            for m, given in zip(restored, messages, strict=True)
        ]

    def restore_keyed(
        self,
        sid: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema] | None = None,
        unchanged: int = 0,
        call_ids: Mapping[int, tuple[str, ...]] | None = None,
    ) -> tuple[list[Message], list[MessageKey], dict[int, tuple[str, ...]]]:
        """`restore_generated_messages`, also returning the routing keys of the result (which
        `splice_anchor` and `record_turn` accept) and `Restored.echo_ids`. `call_ids`: the
        harness's call ids (`Conversation.call_ids`; None: no restore by identity).

        Of the first `unchanged` messages, those that are the very objects of the session's
        previous call take its keys and restores (`Conversation.unchanged`). A restored
        message is the tree's own dict, not a copy: read it, do not change it.
        """
        with self._lock:
            session = self._sessions.get(sid)
            seen = session.echoes.seen if session is not None and unchanged else None
        # Messages that are the previous call's very objects take its keys.
        same = seen.shared(messages, unchanged) if seen and isinstance(messages, list) else 0
        keys = _message_keys(messages, "messages", seen.keys[:same] if seen is not None else ())
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                return list(messages), keys, {}
            restored = session.echoes.restore(
                session.root, messages, keys, tools, seen, same, call_ids, session.shape
            )
        return restored.messages, restored.keys, restored.echo_ids

    def splice_anchor(
        self,
        sid: str,
        messages: Sequence[Message],
        keys: list[MessageKey] | None = None,
    ) -> SpliceAnchor | None:
        """The last generated turn on the exact path of `messages`, its tokens and position:
        a splice builds the next prompt on them; the messages after it are new."""
        keys = _checked_keys(messages, keys, "messages")
        with self._lock:
            session = self._sessions.get(sid)
            return None if session is None else session.anchor(keys)

    def find_turn(self, sid: str, key: str, value: object) -> FoundTurn | None:
        """The conversation (prompt messages, response) and metadata of the session's generated
        turn whose metadata has `key == value`, by a walk of the tree; None if there is none."""
        return self._found(sid, lambda session: _turn_with(session.root, key, value))

    def find_reply(self, sid: str, reply_id: str) -> FoundTurn | None:
        """`find_turn(sid, "reply_id", reply_id)` by lookup (a Responses `previous_response_id`)."""
        return self._found(sid, lambda session: session.reply(reply_id))

    def _found(self, sid: str, lookup: Callable[[SessionState], Node | None]) -> FoundTurn | None:
        with self._lock:
            session = self._sessions.get(sid)
            node = None if session is None else lookup(session)
            return None if node is None else _conversation_of(node)

    def replay_start(
        self, sid: str, messages: Sequence[Message], ids: TokenIds, keys: list[MessageKey] | None
    ) -> int:
        """Where the engine should start reporting replay rows for a turn of these messages and
        prompt ids: positions before it are rows the session's earlier turns hold."""
        keys = _checked_keys(messages, keys, "messages")
        with self._lock:
            session = self._sessions.get(sid)
            return 0 if session is None else session.replay_start(keys, ids)

    def restored_by_tool(self, sid: str) -> dict[str, int]:
        session = self._sessions.get(sid)
        return dict(session.echoes.restored_by_tool) if session else {}

    def restored_echoes(self, sid: str) -> int:
        session = self._sessions.get(sid)
        return session.echoes.restored if session else 0

    # -- linearization ------------------------------------------------------------------------

    def finish(
        self,
        sid: str,
        *,
        reward: float = 0.0,
        extra_metadata: dict[str, Any] | None = None,
        max_sample_tokens: int = 0,
    ) -> Trajectory:
        """Linearize and consume the session: samples, ledger and the drift decisions."""
        max_sample_tokens = _count(max_sample_tokens, "max_sample_tokens")
        with self._lock:
            session = self._sessions.pop(sid, None)
        if session is None:
            return Trajectory([], Ledger())
        try:
            return _linearize(self, sid, session, reward, extra_metadata, max_sample_tokens)
        finally:
            session.release()

    def inspect(self, sid: str, read: SessionReader[T], *, max_sample_tokens: int = 0) -> T:
        """`read(tree, store, trajectory, echoes)` of a session linearized as it stands, under
        the lock and without consuming it (a viewer watches sessions while their turns arrive)."""
        max_sample_tokens = _count(max_sample_tokens, "max_sample_tokens")
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                raise SessionError(f"no session {sid!r}")
            trajectory = _linearize(self, sid, session, 0.0, None, max_sample_tokens)
            return read(session.root, session.store, trajectory, session.echoes)

    def get_trajectory(
        self,
        sid: str,
        *,
        reward: float = 0.0,
        extra_metadata: dict[str, Any] | None = None,
        max_sample_tokens: int = 0,
    ) -> list[Sample]:
        return self.finish(
            sid, reward=reward, extra_metadata=extra_metadata, max_sample_tokens=max_sample_tokens
        ).samples


def turn_store(manager: TrajectoryManager, sid: str) -> _core.TurnStore:
    """The turn store of a session of `manager`, which holds the tokens of the turns in its
    tree (`manager.root(sid)`): read it, do not change it. With a `replay_pool`, its replay
    tapes hold row numbers (their statuses are the rows')."""
    session = manager._sessions.get(sid)
    if session is None:
        raise SessionError(f"no session {sid!r}")
    return session.store


def _linearize(
    manager: TrajectoryManager,
    sid: str,
    session: SessionState,
    reward: float,
    extra_metadata: dict[str, Any] | None,
    max_sample_tokens: int,
) -> Trajectory:
    return linearize_session(
        sid,
        session.root,
        session.store,
        policy=manager.drift_policy,
        fork_threshold=manager.fork_threshold_tokens,
        max_sample_tokens=max_sample_tokens,
        reward=float(reward),
        extra_metadata=extra_metadata,
        restored=session.echoes.restored,
        restored_by_tool=session.echoes.restored_by_tool,
        restored_by_id=session.echoes.restored_by_id,
        replays=manager.replay_channels,
        read_rows=session.row_reader(),
        status=manager.core.REPLAY_STATUS,
        train_superseded=manager.train_superseded,
        train_constrained=manager.train_constrained,
        known_tags=session.tags,
        known_tools=session.tools,
    )


def _response_key(response_message: object) -> MessageKey | None:
    if response_message is None:
        return None
    if not isinstance(response_message, dict):
        raise MessageError("response_message must be a dict or None")
    return message_key(response_message)


def _generated_leaf(
    message: Message | None, key: MessageKey | None, stored: int, turn: CheckedTurn
) -> Node:
    leaf = Node(message, key=key)
    leaf.role = "assistant"
    leaf.turn = StoredTurn(
        stored,
        len(turn.output_ids),
        turn.finish_reason,
        turn.ill_formed,
        turn.history,
        turn.fallback,
        turn.weight_versions,
        discarded=turn.discarded,
    )
    return leaf


def _conversation_of(node: Node) -> FoundTurn:
    path = [n.message for n in node.path()]
    return [m for m in path if m is not None], dict(node.metadata)


def _turn_with(root: Node, key: str, value: object) -> Node | None:
    """The generated turn whose metadata has `key == value`."""
    for node in iter_nodes(root):
        if node.turn is not None and node.metadata.get(key) == value:
            return node
    return None


def _channels(routing: RoutingShape | None, indexer: IndexerShape | None) -> tuple[Replay, ...]:
    kept = ((Replay.ROUTED_EXPERTS, routing), (Replay.INDEXER_TOPK, indexer))
    return tuple(channel for channel, shape in kept if shape is not None)


def _check_sid(sid: object) -> None:
    if not isinstance(sid, str) or not sid:
        raise SessionError(f"session id must be a non-empty str, got {sid!r}")


def _checked_keys(messages: object, keys: list[MessageKey] | None, what: str) -> list[MessageKey]:
    if keys is None:
        return _message_keys(messages, what)
    if not isinstance(messages, list) or len(keys) != len(messages):
        raise MessageError(f"{what}: keys do not belong to these messages")
    return list(keys)


def _message_keys(
    messages: object, what: str, known: Sequence[MessageKey] = ()
) -> list[MessageKey]:
    """The routing keys of `messages`, the first ones `known` already."""
    if not isinstance(messages, list):
        raise MessageError(f"{what} must be a list of messages, got {type(messages).__name__}")
    keys = list(known)
    for pos in range(len(keys), len(messages)):
        m = messages[pos]
        if not isinstance(m, dict):
            raise MessageError(f"{what}[{pos}] must be a dict, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise MessageError(f"{what}[{pos}] has no role")
        keys.append(message_key(m))
    return keys
