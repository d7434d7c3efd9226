"""The routing tree of one session: every prompt message a node, every generated turn a leaf.

Turns are routed by walking from the root and matching each prompt message exactly (role and
canonical JSON); what does not match is mounted as a new branch. Sub-agents, compaction and
rewritten histories become siblings, and each root-to-leaf path is one conversation.
"""

from __future__ import annotations

import json
import operator
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from types import MappingProxyType
from typing import Any

from tokentrail.errors import MessageError
from tokentrail.messages import Message, ToolSchema
from tokentrail.trajectory.turn import StoredTurn

MessageKey = tuple[str, str]


def message_key(message: Mapping[str, Any]) -> MessageKey:
    """A message's identity for routing: key order ignored, list order and JSON types kept.

    String content, usually the bulk of a message, is kept as is rather than serialized: the
    key hashes and compares it directly, and a JSON dump of the rest stays small.
    """
    content = message.get("content")
    rest = {k: v for k, v in message.items() if k != "content"} if "content" in message else message
    try:
        meta = json.dumps(rest, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        if isinstance(content, str):
            # Most messages share a handful of metas ('{"role":"tool"}'): keep one of each.
            return (sys.intern("s" + meta), content)
        body = json.dumps(content, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise MessageError(f"message is not JSON-serializable: {exc}") from None
    # Absent content and JSON content are told apart from string content by the tag.
    return (("j" if "content" in message else "n") + meta, body)


@dataclass
class DemotedTurn:
    """A generated turn whose node was taken over by a rewrite of its message."""

    turn_index: int
    turn: StoredTurn
    message: Message | None
    metadata: Mapping[str, Any] = field(default_factory=dict)


_NO_METADATA: Mapping[str, Any] = MappingProxyType({})


def message_of(key: MessageKey) -> Message:
    """The message a key was made from (key order aside)."""
    tagged, body = key
    message: Message = json.loads(tagged[1:])
    if tagged[0] == "s":
        message["content"] = body
    elif tagged[0] == "j":
        message["content"] = json.loads(body)
    return message


class Node:
    """One message of a session's tree.

    Kept small: a session holds one node per message it ever saw. Only generated turns keep
    their message dict; a routing node keeps its key (which holds the content) and rebuilds
    the dict on demand. Children are indexed by key once there is more than one. A node holds
    the tree alone: what echo restore keeps about it lives in the session's
    `restore.EchoRestorer`.
    """

    __slots__ = (
        "role",
        "_message",
        "key",
        "parent",
        "_children",
        "_by_key",
        "turn",
        "turn_index",
        "tools",
        "metadata",
        "demoted",
    )

    def __init__(
        self,
        message: Message | None = None,
        *,
        key: MessageKey | None = None,
        parent: Node | None = None,
        keep_message: bool = True,
    ) -> None:
        self.role = message.get("role") if message is not None else None
        self.key = key if key is not None or message is None else message_key(message)
        self._message = message if keep_message or self.key is None else None
        self.parent = parent
        self._children: list[Node] | None = None
        self._by_key: dict[MessageKey, Node] | None = None
        # Set on generated assistant leaves only.
        self.turn: StoredTurn | None = None
        self.turn_index: int | None = None
        self.tools: list[ToolSchema] | None = None
        self.metadata: Mapping[str, Any] = _NO_METADATA
        self.demoted: Sequence[DemotedTurn] = ()

    @property
    def message(self) -> Message | None:
        if self._message is None and self.key is not None:
            return message_of(self.key)
        return self._message

    @property
    def children(self) -> Sequence[Node]:
        return self._children or ()

    def child(self, key: MessageKey) -> Node | None:
        if self._by_key is not None:
            return self._by_key.get(key)
        kids = self._children
        if kids and kids[0].key == key:
            return kids[0]
        return None

    def add_child(self, child: Node) -> Node:
        child.parent = self
        if self._children is None:
            self._children = [child]
            return child
        if self._by_key is None:
            first = self._children[0]
            self._by_key = {first.key: first} if first.key is not None else {}
        self._children.append(child)
        if child.key is not None:
            self._by_key.setdefault(child.key, child)
        return child

    def demote(self, demoted: DemotedTurn) -> None:
        self.demoted = [*self.demoted, demoted]

    def rekey(self, message: Message, key: MessageKey) -> None:
        """Replace this node's message (a rewrite merge), keeping the parent's index right."""
        parent = self.parent
        old = self.key
        if parent is not None and parent._by_key is not None:
            if old is not None and parent._by_key.get(old) is self:
                del parent._by_key[old]
                other = next((c for c in parent.children if c is not self and c.key == old), None)
                if other is not None:
                    parent._by_key[old] = other
            parent._by_key.setdefault(key, self)
        self._message, self.key, self.role = message, key, message.get("role")

    def generated_ancestor(self) -> Node | None:
        """The nearest node at or above this one that holds a generated turn."""
        cur: Node | None = self
        while cur is not None and cur.turn is None:
            cur = cur.parent
        return cur

    def path(self) -> list[Node]:
        """Nodes from the first below the root down to this one."""
        out: list[Node] = []
        cur: Node | None = self
        while cur is not None and cur.parent is not None:
            out.append(cur)
            cur = cur.parent
        out.reverse()
        return out


def walk(root: Node, keys: list[MessageKey]) -> tuple[Node, int]:
    """Follow exact matches from the root; return the deepest node and how many matched."""
    cur, i = root, 0
    while i < len(keys):
        nxt = cur.child(keys[i])
        if nxt is None:
            break
        cur, i = nxt, i + 1
    return cur, i


def shared_run(a: Sequence[object], b: Sequence[object], limit: int) -> int:
    """How many leading items of `a` and `b`, at most `limit`, are the very same objects
    (compared in C: a late turn's history costs no Python step per message)."""
    a, b = a[: max(limit, 0)], b[: max(limit, 0)]
    if all(map(operator.is_, a, b)):
        return min(len(a), len(b))
    return list(map(operator.is_, a, b)).index(False)


def equal_run(a: Sequence[object], b: Sequence[object], limit: int) -> int:
    """How many leading items of `a` and `b`, at most `limit`, are equal: when all are the
    very same objects, as a late turn's history mostly is, one comparison in C."""
    a, b = a[: max(limit, 0)], b[: max(limit, 0)]
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])


class WalkMemo:
    """A session's last walk of its tree: the keys it followed, the nodes they reached and
    the tree's shape count then (`_Session.shape`).

    An exact match, once made, holds while the shape count stands: only a rewrite (which
    rekeys a node) takes one back, and the count also moves when a node that has children
    gets another (which can turn a miss into a match). So a walk whose leading keys equal the
    last walk's (mostly the very same objects) takes the nodes they reached without looking
    them up: a late turn looks up its new messages only.
    """

    __slots__ = ("keys", "nodes", "shape")

    def __init__(self, keys: list[MessageKey], nodes: list[Node], shape: int) -> None:
        self.keys, self.nodes, self.shape = keys, nodes, shape

    def walk(self, root: Node, keys: list[MessageKey], shape: int) -> list[Node]:
        """The nodes the exact matches of `keys` reach from `root` (what `walk` follows),
        remembered for the next walk."""
        known = 0
        if shape == self.shape:
            # A walk follows keys by value: equal keys reach the same nodes.
            known = equal_run(keys, self.keys, len(self.nodes))
        nodes = self.nodes[:known]
        cur = nodes[-1] if nodes else root
        for key in islice(keys, known, None):
            nxt = cur.child(key)
            if nxt is None:
                break
            nodes.append(nxt)
            cur = nxt
        self.keys, self.nodes, self.shape = keys, nodes, shape
        return nodes


def iter_nodes(root: Node) -> Iterator[Node]:
    """Depth-first, children in insertion order; iterative so deep sessions cannot overflow."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children))


def marked_and_leaves(root: Node) -> tuple[list[Node], list[Node]]:
    """In `iter_nodes` order, the nodes that hold a generated turn or a demoted one, and the
    leaves (the root aside): what linearization reads, from one walk."""
    marked: list[Node] = []
    found: list[Node] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.turn is not None or node.demoted:
            marked.append(node)
        kids = node._children
        if kids:
            stack.extend(reversed(kids))
        elif node is not root:
            found.append(node)
    return marked, found


def leaves(root: Node) -> Iterator[Node]:
    for node in iter_nodes(root):
        if not node.children and node is not root:
            yield node
