"""`TrajectoryManager`: routes each recorded turn into its session's tree and, at the end,
linearizes the tree into loss-masked samples with a ledger of every generated token.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokentrail.core.backend import BuiltSampleLike, TurnStoreLike, load_backend
from tokentrail.errors import MessageError, PolicyError, SessionError
from tokentrail.kinds import Backend, DriftKind, DriftPolicy, RewritePolicy
from tokentrail.messages import Message, ToolSchema, tool_names
from tokentrail.trajectory import retry
from tokentrail.trajectory.ledger import Ledger, build_ledger, is_superseded
from tokentrail.trajectory.restore import restore_echoes
from tokentrail.trajectory.rewrite import merge_rewrite
from tokentrail.trajectory.sample import Sample
from tokentrail.trajectory.tree import MessageKey, Node, iter_nodes, leaves, message_key, walk
from tokentrail.trajectory.turn import StoredTurn, TurnRecord, validate_turn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriftRecord:
    """One drift decision taken while linearizing: at which turn, of what kind, how big."""

    turn_index: int
    kind: DriftKind
    at: int
    drifted: int


@dataclass(frozen=True)
class SpliceAnchor:
    """The generated turn a splice continues: its tokens, its message, and its position."""

    prompt_ids: Any
    output_ids: Any
    finish_reason: str | None
    message: Message
    index: int


@dataclass
class Trajectory:
    samples: list[Sample]
    ledger: Ledger
    drifts: list[DriftRecord] = field(default_factory=list)

    @property
    def drift_counts(self) -> dict[str, int]:
        return dict(Counter(str(d.kind) for d in self.drifts))


@dataclass
class _Session:
    store: TurnStoreLike  # the backend's TurnStore: every turn's tokens, stored compactly
    root: Node = field(default_factory=Node)
    turns: int = 0
    restored: int = 0
    restored_by_tool: Counter[str] = field(default_factory=Counter)
    # The node holding each generated turn, by turn index.
    by_index: dict[int, Node] = field(default_factory=dict)


def _policy(enum: type[DriftPolicy] | type[RewritePolicy], value: object, what: str) -> Any:
    try:
        return enum(str(value)) if isinstance(value, str) else enum(value)  # type: ignore[arg-type]
    except ValueError:
        known = tuple(p.value for p in enum)
        raise PolicyError(f"unknown {what} {value!r}; expected {known}") from None


class TrajectoryManager:
    """Per-session message trees of recorded turns, linearized into training samples.

    Every public method takes the manager's lock, so concurrent rollout threads may share one.
    """

    def __init__(
        self,
        *,
        fork_threshold_tokens: int = 1024,
        drift_policy: DriftPolicy | str = DriftPolicy.MINIMAL,
        rewrite_policy: RewritePolicy | str = RewritePolicy.FORK,
        backend: Backend | str | None = None,
        train_superseded: bool = False,
    ) -> None:
        self.drift_policy: DriftPolicy = _policy(DriftPolicy, drift_policy, "drift_policy")
        self.rewrite_policy: RewritePolicy = _policy(
            RewritePolicy, rewrite_policy, "rewrite_policy"
        )
        if isinstance(fork_threshold_tokens, bool) or not isinstance(fork_threshold_tokens, int):
            raise PolicyError("fork_threshold_tokens must be an int")
        if fork_threshold_tokens < 0:
            raise PolicyError(f"fork_threshold_tokens must be >= 0, got {fork_threshold_tokens}")
        self.fork_threshold_tokens = fork_threshold_tokens
        # A superseded generation (see `record_turn`) is masked as `superseded` unless this is
        # set: then it trains as a dead-end sample of its own, as any other leaf would.
        self.train_superseded = bool(train_superseded)
        self.core = load_backend(backend)
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.RLock()

    # -- sessions -----------------------------------------------------------------------------

    def has_session(self, sid: str) -> bool:
        return sid in self._sessions

    def turn_count(self, sid: str) -> int:
        session = self._sessions.get(sid)
        return session.turns if session else 0

    def drop_session(self, sid: str) -> bool:
        with self._lock:
            return self._sessions.pop(sid, None) is not None

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
        if response_message is not None:
            if not isinstance(response_message, dict):
                raise MessageError("response_message must be a dict or None")
            response_key = message_key(response_message)
        else:
            response_key = None
        checked = validate_turn(turn)
        if not keys:
            raise MessageError("prompt_messages must not be empty")

        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                session = self._sessions[sid] = _Session(self.core.TurnStore())
            node, i = walk(session.root, keys)
            if supersede and i == len(keys):
                retry.supersede(
                    retry.unanswered(node, checked.prompt_ids, session.store.prompt_ids)
                )
            node, i = merge_rewrite(
                self.rewrite_policy, self.fork_threshold_tokens, node, prompt_messages, keys, i
            )
            # The prompt continues the nearest generated turn above it: its tokens are stored
            # as the prefix shared with that turn plus a tail.
            anchor = node.generated_ancestor()
            stored = session.store.push(
                anchor.turn.id if anchor is not None and anchor.turn is not None else -1,
                checked.prompt_ids,
                checked.output_ids,
                checked.logprobs,
            )
            for message, key in zip(prompt_messages[i:], keys[i:], strict=True):
                node = node.add_child(Node(message, key=key, keep_message=False))
            session.turns += 1
            leaf = Node(response_message, key=response_key)
            leaf.role = "assistant"
            leaf.turn = StoredTurn(
                stored,
                len(checked.output_ids),
                checked.finish_reason,
                checked.ill_formed,
                checked.history,
                checked.fallback,
            )
            leaf.turn_index, leaf.tools = session.turns, tools
            if metadata:
                leaf.metadata = dict(metadata)
            node.add_child(leaf)
            session.by_index[session.turns] = leaf
            return session.turns

    # -- retries ------------------------------------------------------------------------------

    def unanswered_turns(
        self,
        sid: str,
        prompt_messages: Sequence[Message],
        prompt_ids: Any,
        keys: list[MessageKey] | None = None,
    ) -> list[int]:
        """Turns a request with this prompt repeats (see `trajectory.retry`), latest first."""
        keys = _checked_keys(prompt_messages, keys, "prompt_messages")
        prompt = np.asarray(prompt_ids, dtype=np.uint32)
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                return []
            node, i = walk(session.root, keys)
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
        """Replace every recognized echo of a generated message with the message we stored.

        See `tokentrail.trajectory.restore`. Returns a new list; the caller's list and dicts
        are left alone.
        """
        restored, _ = self.restore_keyed(sid, messages, tools)
        # The restored dicts are the tree's own: hand out copies.
        return [
            m if m is given else copy.deepcopy(m)
            for m, given in zip(restored, messages, strict=True)
        ]

    def restore_keyed(
        self,
        sid: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema] | None = None,
    ) -> tuple[list[Message], list[MessageKey]]:
        """`restore_generated_messages`, also returning the routing keys of the result, which
        `splice_anchor` and `record_turn` accept so a turn computes them once.

        A restored message is the tree's own dict, not a copy: read it, do not change it.
        """
        keys = _message_keys(messages, "messages")
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                return list(messages), keys
            restored = restore_echoes(session.root, messages, keys, tools)
            for node in restored.newly:
                session.restored += 1
                session.restored_by_tool.update(tool_names(node.message))
        return restored.messages, restored.keys

    def splice_anchor(
        self,
        sid: str,
        messages: Sequence[Message],
        keys: list[MessageKey] | None = None,
    ) -> SpliceAnchor | None:
        """The last generated turn on the exact path of `messages`, its tokens and position.

        A splice builds the next prompt on that turn's tokens; the messages after it are new.
        """
        keys = _checked_keys(messages, keys, "messages")
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                return None
            node, found = session.root, None
            for i, key in enumerate(keys):
                nxt = node.child(key)
                if nxt is None:
                    break
                node = nxt
                if node.turn is not None and node.message is not None:
                    found = (node.turn, node.message, i)
            if found is None:
                return None
            turn, message, at = found
            return SpliceAnchor(
                session.store.prompt_ids(turn.id),
                session.store.output_ids(turn.id),
                turn.finish_reason,
                message,
                at,
            )

    def restored_by_tool(self, sid: str) -> dict[str, int]:
        session = self._sessions.get(sid)
        return dict(session.restored_by_tool) if session else {}

    def restored_echoes(self, sid: str) -> int:
        session = self._sessions.get(sid)
        return session.restored if session else 0

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
        if isinstance(max_sample_tokens, bool) or not isinstance(max_sample_tokens, int):
            raise PolicyError("max_sample_tokens must be an int")
        if max_sample_tokens < 0:
            raise PolicyError(f"max_sample_tokens must be >= 0, got {max_sample_tokens}")
        with self._lock:
            session = self._sessions.pop(sid, None)
        if session is None:
            return Trajectory([], Ledger())
        return _linearize(self, sid, session, float(reward), extra_metadata, max_sample_tokens)

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


def _linearize(
    manager: TrajectoryManager,
    sid: str,
    session: _Session,
    reward: float,
    extra_metadata: dict[str, Any] | None,
    max_sample_tokens: int,
) -> Trajectory:
    # Store ids are turn indices - 1: a turn is pushed when it is recorded.
    generated: dict[int, Node] = {
        n.turn.id: n for n in iter_nodes(session.root) if n.turn is not None
    }
    lin = session.store.linearize(
        _chains(session.root, manager.train_superseded),
        policy=manager.drift_policy.value,
        fork_threshold=manager.fork_threshold_tokens,
        max_sample_tokens=max_sample_tokens,
    )
    samples = [_sample(sid, built, generated, reward, extra_metadata) for built in lin.samples]
    ledger = build_ledger(
        session.root,
        lin,
        restored_echoes=session.restored,
        restored_by_tool=session.restored_by_tool,
        mask_superseded=not manager.train_superseded,
    )
    drifts = [
        DriftRecord(generated[d.turn].turn_index or 0, DriftKind(d.kind), d.at, d.drifted)
        for d in lin.drifts
    ]
    return Trajectory(samples, ledger, drifts)


def _chains(root: Node, train_superseded: bool) -> list[list[int]]:
    """Each leaf's chain of generated turns (store ids), superseded leaves left out unless
    they train."""
    chains = []
    for leaf in leaves(root):
        if is_superseded(leaf) and not train_superseded:
            continue
        chain = [n.turn.id for n in leaf.path() if n.turn is not None]
        if chain:
            chains.append(chain)
    return chains


def _sample(
    sid: str,
    built: BuiltSampleLike,
    generated: dict[int, Node],
    reward: float,
    extra_metadata: dict[str, Any] | None,
) -> Sample:
    nodes = [generated[t] for t in built.turns]
    turns: list[StoredTurn] = [n.turn for n in nodes if n.turn is not None]
    last = nodes[-1]
    metadata: dict[str, Any] = {
        "session_id": sid,
        "chain": built.chain,
        "turns": [n.turn_index for n in nodes],
        "truncated": bool(built.truncated),
        "use_tool": any(tool_names(n.message) for n in nodes),
        "ill_formed": any(t.ill_formed for t in turns),
        "finish_reason": last.turn.finish_reason if last.turn else None,
        "tools": last.tools,
    }
    metadata.update(extra_metadata or {})
    return Sample(
        tokens=built.tokens,
        loss_mask=built.loss_mask,
        rollout_log_probs=built.logprobs,
        response_length=len(built.loss_mask),
        reward=reward,
        metadata=metadata,
    )


def _check_sid(sid: object) -> None:
    if not isinstance(sid, str) or not sid:
        raise SessionError(f"session id must be a non-empty str, got {sid!r}")


def _checked_keys(messages: object, keys: list[MessageKey] | None, what: str) -> list[MessageKey]:
    if keys is None:
        return _message_keys(messages, what)
    if not isinstance(messages, list) or len(keys) != len(messages):
        raise MessageError(f"{what}: keys do not belong to these messages")
    return list(keys)


def _message_keys(messages: object, what: str) -> list[MessageKey]:
    if not isinstance(messages, list):
        raise MessageError(f"{what} must be a list of messages, got {type(messages).__name__}")
    keys = []
    for pos, m in enumerate(messages):
        if not isinstance(m, dict):
            raise MessageError(f"{what}[{pos}] must be a dict, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise MessageError(f"{what}[{pos}] has no role")
        keys.append(message_key(m))
    return keys
