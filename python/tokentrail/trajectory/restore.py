"""Echo restore: a harness's re-rendering of a generated message is replaced by the message we
generated, before the turn is rendered, so the tree and the token prefix line up.

Two modules, two ideas: `echo.py` recognizes an echo (normalizes two messages and compares
them); this module restores: it walks a session's tree along an incoming message list and
substitutes every recognized echo with the tree's own dict. `EchoRestorer` is one session's
restore and owns all of its state; the tree's `Node`s hold the tree alone.

An echo is recognized two ways. By identity: its tool calls carry the ids we minted for a
generated turn (the harness sent them, `Conversation.call_ids`) and name the same tools, so it
is our call whatever the harness did to the arguments (Claude Code drops a `cd` into its own
working directory from a Bash command); what differed is recorded (`ByIdRestore`). And by the
coarse comparison (`echo.is_echo`: declared defaults, per-line right-strip), strict, for
echoes whose ids the harness dropped or re-minted.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tokentrail.errors import MessageError
from tokentrail.kinds import REASONING_FIELDS, EchoDifference
from tokentrail.messages import Message, ToolSchema, tool_names
from tokentrail.trajectory.echo import echo_difference, is_echo
from tokentrail.trajectory.tags import TurnTags
from tokentrail.trajectory.tree import MessageKey, Node, message_key, message_of, shared_run

logger = logging.getLogger(__name__)


@dataclass
class Restored:
    """An incoming message list with its echoes restored.

    A restored message is the tree's own dict, not a copy: read it, do not change it. `newly`
    holds the generated nodes restored for the first time by this call.
    """

    messages: list[Message]
    keys: list[MessageKey]
    newly: list[Node] = field(default_factory=list)
    # Of `newly`, those recognized by identity only.
    by_id: list[ByIdRestore] = field(default_factory=list)
    # The node each message reached, for the messages the walk got through.
    nodes: list[Node] = field(default_factory=list)

    @property
    def echo_ids(self) -> dict[int, tuple[str, ...]]:
        """The call ids of `by_id`, by message index: what a replay of the turn needs to
        restore them again (`TurnTags.echo_ids`)."""
        return {found.index: found.call_ids for found in self.by_id}


@dataclass(frozen=True)
class ByIdRestore:
    """An echo restored by identity that the coarse comparison did not recognize: the
    incoming message's position, the call ids that proved it, and what the harness changed."""

    index: int
    node: Node
    call_ids: tuple[str, ...]
    difference: EchoDifference


@dataclass(frozen=True)
class Seen:
    """One `EchoRestorer.restore` call: the messages given, their keys, the messages it
    returned with their keys, the node each reached and the tree's shape count then."""

    given: list[Message]
    keys: list[MessageKey]
    restored: list[Message]
    restored_keys: list[MessageKey] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    shape: int = -1

    def shared(self, messages: Sequence[object], unchanged: int) -> int:
        """How many leading messages, among the first `unchanged`, are the very objects this
        call was given: a next call takes their keys rather than computing them, and passes
        the count to `EchoRestorer.restore`."""
        return shared_run(messages, self.given, unchanged)


class EchoRestorer:
    """One session's echo restore and everything it keeps between calls.

    Per tree node, the keys of the harness echoes recognized among its children and the
    generated child each one restores to (a harness replays an echo the same way every time:
    it is recognized once); the generated nodes restored so far (each counts once); the counts
    the ledger reports; and the session's previous call (`seen`), whose keys and restores a
    next call that shares its messages reuses.
    """

    __slots__ = ("_echoes", "_restored", "seen", "restored", "restored_by_tool", "restored_by_id")

    def __init__(self) -> None:
        self._echoes: dict[Node, dict[MessageKey, Node]] = {}
        self._restored: set[Node] = set()
        # The latest conversation restored.
        self.seen: Seen | None = None
        # Generated messages restored, in all and by tool; of those, the ones restored by
        # identity only: tool -> what the harness changed -> count.
        self.restored = 0
        self.restored_by_tool: Counter[str] = Counter()
        self.restored_by_id: dict[str, Counter[str]] = {}

    def restore(
        self,
        root: Node,
        messages: Sequence[Message],
        keys: list[MessageKey],
        tools: Sequence[ToolSchema] | None,
        seen: Seen | None = None,
        unchanged: int = 0,
        call_ids: Mapping[int, tuple[str, ...]] | None = None,
        shape: int = -1,
    ) -> Restored:
        """Walk from `root`: exact matches advance; where nothing matches exactly, a generated
        assistant child that the incoming message is an echo of is substituted (by identity:
        its calls carry the ids minted for that child, to the same tools; else
        `echo.is_echo`), and the walk goes on. `keys` are the incoming messages' routing keys.

        An exact match of a generated message is substituted too: routing keys ignore key
        order, templates do not (`tojson` writes arguments in dict order), so a harness that
        sorts the keys of our arguments (hermes-agent) would render other tokens than were
        sampled. It counts as a restore when the key order differed.

        `seen` is `self.seen` as the caller read it (None once another call replaced it), and
        the first `unchanged` messages are the very objects it was given (`Seen.shared`): one
        substituted by the same generated message then was compared then. `call_ids` (by
        message index) are the ids the harness sent with each message's calls; None turns
        restore by identity off, leaving the coarse comparison alone.

        `shape` is the tree's shape count (`tree.WalkMemo`; -1: unknown). While it stands, the
        first `unchanged` messages restore as they did then, to the same nodes, without a
        step of the walk: each was matched, or recognized as an echo, then, and nothing since
        can change that.
        """
        seen = seen if seen is self.seen else None
        restored = self._walk(root, messages, keys, tools, seen, unchanged, call_ids, shape)
        self.seen = Seen(
            list(messages), keys, restored.messages, restored.keys, restored.nodes, shape
        )
        for node in restored.newly:
            self.restored += 1
            self.restored_by_tool.update(tool_names(node.message))
        for found in restored.by_id:
            for tool in tool_names(found.node.message):
                self.restored_by_id.setdefault(tool, Counter())[found.difference.value] += 1
        return restored

    def echoes_of(self, child: Node) -> list[Message]:
        """The harness's versions of `child`'s message that were restored to it."""
        echoes = self._echoes.get(child.parent) if child.parent is not None else None
        return [message_of(k) for k, c in (echoes or {}).items() if c is child]

    def _walk(
        self,
        root: Node,
        messages: Sequence[Message],
        keys: list[MessageKey],
        tools: Sequence[ToolSchema] | None,
        seen: Seen | None,
        unchanged: int,
        call_ids: Mapping[int, tuple[str, ...]] | None,
        shape: int,
    ) -> Restored:
        out = list(messages)
        keys = list(keys)
        newly: list[Node] = []
        by_id: list[ByIdRestore] = []
        known = 0
        if seen is not None and shape >= 0 and seen.shape == shape:
            known = min(unchanged, len(seen.nodes))
            out[:known] = seen.restored[:known]
            keys[:known] = seen.restored_keys[:known]
        nodes = seen.nodes[:known] if seen is not None else []
        node = nodes[-1] if nodes else root
        for i in range(known, len(keys)):
            key = keys[i]
            nxt = node.child(key)
            if nxt is not None:
                generated = nxt.message if nxt.turn is not None else None
                if generated is not None and seen is not None and i < unchanged:
                    if i < len(seen.given) and out[i] is seen.given[i]:
                        if seen.restored[i] is generated:
                            out[i] = generated
                            node = nxt
                            nodes.append(nxt)
                            continue
                if generated is not None and generated is not out[i]:
                    reordered = not _same_layout(generated, out[i])
                    out[i] = generated
                    if reordered and nxt not in self._restored:
                        self._restored.add(nxt)
                        newly.append(nxt)
            else:
                # A harness replays an echo the same way every time: recognize it once.
                nxt = self._known(node, key)
                if nxt is None:
                    ids = call_ids.get(i) if call_ids is not None else None
                    found = _id_target(node, out[i], ids) if ids else None
                    if found is not None and not _coarse_echo(found, out[i], tools):
                        kind = _difference(found, out[i], tools)
                        if found not in self._restored:
                            by_id.append(ByIdRestore(i, found, ids or (), kind))
                        logger.debug("echo restored by its call ids %s (%s differ)", ids, kind)
                        nxt = found
                    else:
                        nxt = _echo_target(node, out[i], tools)
                    if nxt is None:
                        break
                    self._echoes.setdefault(node, {})[key] = nxt
                generated = nxt.message
                assert generated is not None  # an echo target is a generated turn
                out[i] = generated
                keys[i] = nxt.key if nxt.key is not None else message_key(generated)
                if nxt not in self._restored:
                    self._restored.add(nxt)
                    newly.append(nxt)
            node = nxt
            nodes.append(nxt)
        return Restored(out, keys, newly, by_id, nodes)

    def _known(self, node: Node, key: MessageKey) -> Node | None:
        """The generated child an echo with this key was recognized as, under `node`."""
        echoes = self._echoes.get(node)
        child = echoes.get(key) if echoes is not None else None
        # A child that has since stopped being a generated turn restores nothing.
        return child if child is not None and child.turn is not None else None


def _id_target(node: Node, message: Message, ids: tuple[str, ...]) -> Node | None:
    """The generated child whose tool calls we sent with exactly these ids, to the same tools
    in the same order; None when there is none."""
    if message.get("role") != "assistant":
        return None
    names = tool_names(message)
    for child in node.children:
        if child.turn is None or child.message is None:
            continue
        if TurnTags.read(child.metadata).call_ids == ids:
            return child if tool_names(child.message) == names else None
    return None


def _coarse_echo(child: Node, message: Message, tools: Sequence[ToolSchema] | None) -> bool:
    generated = child.message
    assert generated is not None
    try:
        return is_echo(generated, message, tools)
    except MessageError:
        return False


def _difference(
    child: Node, message: Message, tools: Sequence[ToolSchema] | None
) -> EchoDifference:
    """What the harness changed in an echo of `child`'s message (its first difference)."""
    generated = child.message
    assert generated is not None
    try:
        where = echo_difference(generated, message, tools) or ""
    except MessageError:
        return EchoDifference.OTHER
    if where.startswith("tool_calls") and ".arguments" in where:
        return EchoDifference.ARGUMENTS
    if where.startswith("content"):
        return EchoDifference.CONTENT
    if where.split(":", 1)[0].split(".", 1)[0] in REASONING_FIELDS:
        return EchoDifference.REASONING
    return EchoDifference.OTHER


def _echo_target(node: Node, message: Message, tools: Sequence[ToolSchema] | None) -> Node | None:
    """The generated child `message` is an echo of; None when there is none, or when two
    different generated messages both match (the echo then proves neither)."""
    if message.get("role") != "assistant":
        return None
    found: Node | None = None
    for child in node.children:
        generated = child.message
        if child.turn is not None and generated is not None:
            try:
                if not is_echo(generated, message, tools):
                    continue
            except MessageError as exc:
                logger.debug("not an echo, malformed message: %s", exc)
                return None
            if found is None:
                found = child
            elif found.key != child.key:
                logger.debug("echo matches two generated messages; not restored")
                return None
    return found


def _same_layout(a: object, b: object) -> bool:
    """Equal values (as routing keys see them) laid out alike: dict keys in the same order."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same_layout(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_layout(x, y) for x, y in zip(a, b, strict=True))
    return True
