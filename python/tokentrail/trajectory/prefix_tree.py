"""The shared-prefix (tree) layout: row-samples merged at their common prefixes, so a trainer
with tree attention computes every distinct prefix's token once instead of once per row.

Rows (one session's samples, or a GRPO group's) go into a token trie keyed by what a forward
pass reads per token: its id and, when the samples carry them, its replay rows (routed experts,
indexer top-k), so a node's hidden states are the same in every row through it. Nodes are
numbered in depth-first preorder, so node `j` is an ancestor of node `i` exactly when
`j <= i < subtree_end[j]`: the whole tree attention mask in one integer per token. Position ids
are depths. Labels stay per row (`row_loss_mask`, `row_logprobs`, ...), each row token mapped to
its node by `row_nodes`, so per-row rewards and advantages stay exact; the per-node labels are
what the rows that train a node agree on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tokentrail.core.ids import LogprobArray, MaskArray, RowArray, TokenArray
from tokentrail.errors import TreeError
from tokentrail.kinds import TreeMask, parse_kind
from tokentrail.trajectory.layout_stats import TreeStats
from tokentrail.trajectory.sample import REPLAY_FIELDS, Sample

# A dense boolean mask past this many nodes is over 1 GiB: ask for the flex block mask instead.
MAX_DENSE_TOKENS = 32768

_Int32 = npt.NDArray[np.int32]
_Int64 = npt.NDArray[np.int64]


def tree_mask(value: TreeMask | str) -> TreeMask:
    """`value` as a `TreeMask`, or a `TreeError` naming the allowed values."""
    return parse_kind(TreeMask, value, "tree mask", TreeError)


@dataclass
class PrefixTree:
    """Rows merged into one prefix tree, nodes in depth-first preorder.

    Per node (`N`): `tokens` (uint32), `parent` (int32, -1 for a first token), `position_ids`
    (int32, the depth), `subtree_end` (int32: the node's descendants are the nodes after it up
    to this index), `trained_rows` (int32, how many rows train the node), `loss_mask` (uint8,
    trained by some row), `logprobs` (float32, the rollout logprob the training rows recorded,
    0 where none trains it), `weight_version` (int32 index into `versions`, -1 for none), and
    the replay rows `[N, layers, k]` when the samples carry them.

    Per row (`R`, the samples in input order): `row_offsets` (int64, R + 1) split the per-row-
    token arrays `row_nodes` (int32, each row token's node: its path in the tree),
    `row_loss_mask` (uint8), `row_logprobs` (float32) and `row_weight_version` (int32), each
    over the row's whole sequence (0 / -1 on its prompt); `rewards` (float32),
    `response_lengths` (int64), `row_sessions` (the samples' `session_id`).

    Blocks: the maximal single-child chains, in preorder; block `b` is the nodes
    `block_offsets[b]:block_offsets[b + 1]`, hanging under block `block_parent[b]` (-1: the
    root). Every row ends at the end of a block.
    """

    tokens: TokenArray
    parent: _Int32
    position_ids: _Int32
    subtree_end: _Int32
    trained_rows: _Int32
    loss_mask: MaskArray
    logprobs: LogprobArray
    weight_version: _Int32
    versions: list[str]
    row_offsets: _Int64
    row_nodes: _Int32
    row_loss_mask: MaskArray
    row_logprobs: LogprobArray
    row_weight_version: _Int32
    rewards: npt.NDArray[np.float32]
    response_lengths: _Int64
    row_sessions: list[str]
    block_offsets: _Int64
    block_parent: _Int32
    # Nodes two training rows give different rollout logprobs or weight versions: their
    # per-node label is the first such row's; a trainer should use the per-row labels there.
    label_conflicts: int = 0
    routed_experts: RowArray | None = None
    indexer_topk: RowArray | None = None
    row_metadata: list[dict[str, Any]] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    @property
    def num_rows(self) -> int:
        return len(self.rewards)

    @property
    def stats(self) -> TreeStats:
        return TreeStats(self.num_rows, int(self.row_offsets[-1]), self.num_nodes)

    def row_path(self, row: int) -> _Int32:
        """The nodes of row `row`, one per token of its sample, root first."""
        return self.row_nodes[self.row_offsets[row] : self.row_offsets[row + 1]]

    def session_stats(self) -> dict[str, TreeStats]:
        """Per session (`row_sessions`): its rows' tokens, and the distinct nodes they use."""
        by_session: dict[str, list[int]] = {}
        for row, sid in enumerate(self.row_sessions):
            by_session.setdefault(sid, []).append(row)
        out = {}
        for sid, rows in by_session.items():
            paths = [self.row_path(r) for r in rows]
            used = np.zeros(self.num_nodes, dtype=bool)
            for path in paths:
                used[path] = True
            out[sid] = TreeStats(len(rows), sum(len(p) for p in paths), int(used.sum()))
        return out

    def gather(self, node_values: np.ndarray) -> list[np.ndarray]:
        """Per-node values (a forward pass's logprobs over the tree) as one array per row."""
        values = np.asarray(node_values)[self.row_nodes]
        return np.split(values, self.row_offsets[1:-1])

    def scatter(
        self, row_values: Sequence[float] | npt.NDArray[np.floating]
    ) -> npt.NDArray[np.float64]:
        """One value per row (an advantage) summed onto the nodes each row trains: a loss
        `sum(node_weight * f(logprob))` over the tree equals the rows' summed losses."""
        values = np.asarray(row_values, dtype=np.float64)
        if values.shape != (self.num_rows,):
            raise TreeError(
                f"scatter takes one value per row ({self.num_rows}), got {values.shape}"
            )
        per_token = np.repeat(values, np.diff(self.row_offsets)) * self.row_loss_mask
        out = np.zeros(self.num_nodes, dtype=np.float64)
        np.add.at(out, self.row_nodes, per_token)
        return out

    def attention_mask(self) -> npt.NDArray[np.bool_]:
        """`[N, N]` booleans, True where query node `i` may attend to key node `j` (its
        ancestors and itself)."""
        n = self.num_nodes
        if n > MAX_DENSE_TOKENS:
            raise TreeError(
                f"a dense mask of {n} tree tokens is {n * n / 2**30:.1f} GiB "
                f"(limit {MAX_DENSE_TOKENS} tokens); use the flex block mask"
            )
        index = np.arange(n)
        return (index[None, :] <= index[:, None]) & (index[:, None] < self.subtree_end[None, :])

    def to_torch(
        self, mask: TreeMask | str = TreeMask.DENSE, *, block_size: int = 128, device: Any = None
    ) -> dict[str, Any]:
        """Tensors for a trainer: `input_ids` and `position_ids` (int64, `[1, N]`, as a
        transformers model takes them), the node and row arrays as numpy holds them (shared
        memory; `row_nodes` int64 for indexing), replay rows when carried, and the mask:
        `attention_mask` `[1, 1, N, N]` bool for `scaled_dot_product_attention` (`dense`),
        `block_mask` a flex-attention `BlockMask` (`flex`), or neither (`none`)."""
        import torch

        kind = tree_mask(mask)
        out: dict[str, Any] = {
            "input_ids": torch.from_numpy(self.tokens.astype(np.int64))[None].to(device),
            "position_ids": torch.from_numpy(self.position_ids.astype(np.int64))[None].to(device),
            "row_nodes": torch.from_numpy(self.row_nodes.astype(np.int64)).to(device),
        }
        for name in (
            "parent",
            "subtree_end",
            "trained_rows",
            "loss_mask",
            "logprobs",
            "weight_version",
            "row_offsets",
            "row_loss_mask",
            "row_logprobs",
            "rewards",
            *REPLAY_FIELDS,
        ):
            value = getattr(self, name)
            if value is not None:
                out[name] = torch.from_numpy(value).to(device)
        if kind is TreeMask.DENSE:
            out["attention_mask"] = torch.from_numpy(self.attention_mask())[None, None].to(device)
        elif kind is TreeMask.FLEX:
            out["block_mask"] = self.block_mask(block_size=block_size, device=device)
        return out

    def block_mask(self, *, block_size: int = 128, device: Any = None) -> Any:
        """The tree mask as a flex-attention `BlockMask` (torch >= 2.5), built from
        `subtree_end` without a dense `[N, N]` tensor."""
        import torch

        try:
            from torch.nn.attention.flex_attention import create_block_mask
        except ImportError:
            raise TreeError(f"torch {torch.__version__} has no flex attention (2.5+)") from None
        end = torch.from_numpy(self.subtree_end.astype(np.int64)).to(device or "cpu")

        def ancestors(b: Any, h: Any, q: Any, kv: Any) -> Any:
            return (kv <= q) & (q < end[kv])

        n = self.num_nodes
        return create_block_mask(
            ancestors, None, None, n, n, device=str(end.device), BLOCK_SIZE=block_size
        )


# --- Building ------------------------------------------------------------------------------------


class _Row:
    """One sample's forward inputs: ids and replay rows flattened to `[n, bytes]`."""

    __slots__ = ("tokens", "replay")

    def __init__(self, tokens: TokenArray, replay: list[npt.NDArray[np.unsignedinteger]]) -> None:
        self.tokens = tokens
        self.replay = replay

    def key(self, pos: int) -> bytes:
        return self.tokens[pos : pos + 1].tobytes() + b"".join(
            r[pos].tobytes() for r in self.replay
        )


def _common(a: _Row, a_at: int, b: _Row, b_at: int, n: int) -> int:
    """How many of the next `n` positions of `a` and `b` hold the same forward inputs."""
    if n <= 0:
        return 0
    diff = a.tokens[a_at : a_at + n] != b.tokens[b_at : b_at + n]
    for x, y in zip(a.replay, b.replay, strict=True):
        diff |= (x[a_at : a_at + n] != y[b_at : b_at + n]).any(axis=1)
    first = int(diff.argmax())
    return first if diff[first] else n


class _Block:
    """A single-child chain of the trie: positions `start:start + length` of row `row`."""

    __slots__ = ("row", "start", "length", "parent", "children", "offset", "end", "depth")

    def __init__(self, row: int, start: int, length: int, parent: _Block | None) -> None:
        self.row, self.start, self.length, self.parent = row, start, length, parent
        self.children: dict[bytes, _Block] = {}
        self.offset = self.end = self.depth = 0


def _insert(root: _Block, rows: list[_Row], r: int) -> _Block:
    """Insert row `r`; the block it ends at (split so that it ends at a block's end)."""
    row, at, block = rows[r], 0, root
    n = len(row.tokens)
    while at < n:
        key = row.key(at)
        child = block.children.get(key)
        if child is None:
            child = block.children[key] = _Block(r, at, n - at, block)
            return child
        # The first position matched by its key.
        same = 1 + _common(
            row, at + 1, rows[child.row], child.start + 1, min(child.length, n - at) - 1
        )
        if same < child.length:
            child = _split(child, same, key, rows)
        at, block = at + same, child
    return block


def _split(block: _Block, length: int, key: bytes, rows: list[_Row]) -> _Block:
    """Cut `block` after `length` positions; the head takes its place under its parent (and
    its key there), `block` itself becomes the tail, so rows ending at it still do."""
    parent = block.parent
    assert parent is not None
    head = _Block(block.row, block.start, length, parent)
    parent.children[key] = head
    block.start += length
    block.length -= length
    block.parent = head
    head.children[rows[block.row].key(block.start)] = block
    return head


def _preorder(root: _Block) -> list[_Block]:
    order: list[_Block] = []
    stack = list(reversed(root.children.values()))
    while stack:
        block = stack.pop()
        order.append(block)
        stack.extend(reversed(block.children.values()))
    return order


def _number(order: list[_Block]) -> None:
    """Give every block its node offset, depth and subtree end."""
    offset = 0
    for block in order:
        parent = block.parent
        block.depth = parent.depth + parent.length if parent is not None else 0
        block.offset = offset
        offset += block.length
    for block in reversed(order):
        block.end = max(
            (c.end for c in block.children.values()), default=block.offset + block.length
        )


def _replay_rows(samples: Sequence[Sample]) -> dict[str, list[RowArray]]:
    """Each replay field the samples carry: all of them, one row per token, of one shape."""
    out = {}
    for name in REPLAY_FIELDS:
        held = [getattr(s, name) for s in samples]
        missing = [i for i, rows in enumerate(held) if rows is None]
        if len(missing) == len(held):
            continue
        if missing:
            raise TreeError(f"{name}: sample {missing[0]} has none, others have")
        arrays = [np.asarray(rows) for rows in held]
        for i, (rows, sample) in enumerate(zip(arrays, samples, strict=True)):
            if rows.ndim != 3 or len(rows) != len(sample.tokens):
                raise TreeError(f"{name}: sample {i} holds {rows.shape}, not one row per token")
        if len({(rows.dtype, rows.shape[1:]) for rows in arrays}) != 1:
            raise TreeError(f"{name}: samples hold rows of more than one type or shape")
        out[name] = arrays
    return out


def _rows(samples: Sequence[Sample], replay: dict[str, list[RowArray]]) -> list[_Row]:
    out = []
    for i, sample in enumerate(samples):
        tokens = np.ascontiguousarray(np.asarray(sample.tokens, dtype=np.uint32))
        flat = [_row_words(replay[name][i], len(tokens)) for name in replay]
        out.append(_Row(tokens, flat))
    return out


def _row_words(rows: RowArray, n: int) -> npt.NDArray[np.unsignedinteger]:
    """Replay rows as `[n, words]` of the widest unsigned type their bytes divide into, so
    comparing a 48 x 8 uint8 row is 48 word compares, not 384 byte compares."""
    raw = np.ascontiguousarray(rows).view(np.uint8).reshape(n, rows[0].nbytes if n else 0)
    for word in (np.uint64, np.uint32, np.uint16):
        if raw.shape[1] % np.dtype(word).itemsize == 0:
            return raw.view(word)
    return raw


def _row_labels(
    samples: Sequence[Sample], versions: dict[str, int]
) -> Iterator[tuple[MaskArray, LogprobArray, _Int32]]:
    """Per sample, over its whole sequence: loss mask, logprobs, weight version index."""
    for i, sample in enumerate(samples):
        n, response = len(sample.tokens), int(sample.response_length)
        mask = np.asarray(sample.loss_mask, dtype=np.uint8)
        lps = np.asarray(sample.rollout_log_probs, dtype=np.float32)
        if not 0 <= response <= n or len(mask) != response or len(lps) != response:
            raise TreeError(
                f"sample {i}: {len(mask)} loss-mask and {len(lps)} logprob entries for a "
                f"response of {response} of {n} tokens"
            )
        full_mask = np.zeros(n, dtype=np.uint8)
        full_mask[n - response :] = mask
        full_lps = np.zeros(n, dtype=np.float32)
        full_lps[n - response :] = lps
        version = np.full(n, -1, dtype=np.int32)
        for span in sample.metadata.get("weight_versions") or ():
            index = versions.setdefault(str(span["version"]), len(versions))
            version[int(span["start"]) : int(span["end"])] = index
        yield full_mask, full_lps, version


def build_prefix_tree(samples: Sequence[Sample]) -> PrefixTree:
    """Merge `samples` into one `PrefixTree` at their longest common prefixes of forward
    inputs (ids, and replay rows when carried). Raises `TreeError` for a sample whose mask or
    logprobs do not fit its response, or replay rows some samples carry and others not."""
    replay = _replay_rows(samples)
    rows = _rows(samples, replay)
    versions: dict[str, int] = {}
    labels = list(_row_labels(samples, versions))
    root = _Block(-1, 0, 0, None)
    ends = [_insert(root, rows, r) for r in range(len(rows))]
    order = _preorder(root)
    _number(order)

    lengths = np.array([b.length for b in order], dtype=np.int64)
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    n = int(offsets[-1])
    first = offsets[:-1]
    in_block = np.arange(n, dtype=np.int64) - np.repeat(first, lengths)
    tokens = (
        np.concatenate([rows[b.row].tokens[b.start : b.start + b.length] for b in order])
        if order
        else np.zeros(0, dtype=np.uint32)
    )
    position_ids = (np.repeat([b.depth for b in order], lengths) + in_block).astype(np.int32)
    subtree_end = np.repeat([b.end for b in order], lengths).astype(np.int32)
    parent = np.arange(-1, n - 1, dtype=np.int32)
    index = {id(b): i for i, b in enumerate(order)}
    block_parent = np.array([index.get(id(b.parent), -1) for b in order], dtype=np.int32)
    has_parent = block_parent >= 0
    parent[first[has_parent]] = (offsets[block_parent[has_parent] + 1] - 1).astype(np.int32)
    parent[first[~has_parent]] = -1

    paths = []
    for end in ends:
        chain = []
        block: _Block | None = end
        while block is not None and block is not root:
            chain.append(np.arange(block.offset, block.offset + block.length, dtype=np.int32))
            block = block.parent
        paths.append(np.concatenate(chain[::-1]) if chain else np.zeros(0, dtype=np.int32))
    row_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in paths], out=row_offsets[1:])
    row_nodes = np.concatenate(paths) if paths else np.zeros(0, dtype=np.int32)
    row_mask = _cat([lab[0] for lab in labels], np.uint8)
    row_lps = _cat([lab[1] for lab in labels], np.float32)
    row_version = _cat([lab[2] for lab in labels], np.int32)

    trained = row_mask.astype(bool)
    trained_nodes = row_nodes[trained]
    trained_rows = np.bincount(trained_nodes, minlength=n).astype(np.int32)
    node_lps = np.zeros(n, dtype=np.float32)
    node_version = np.full(n, -1, dtype=np.int32)
    # The first training row's labels are the node's.
    labelled, first_row = np.unique(trained_nodes, return_index=True)
    node_lps[labelled] = row_lps[trained][first_row]
    node_version[labelled] = row_version[trained][first_row]
    disagree = (node_lps[trained_nodes].view(np.uint32) != row_lps[trained].view(np.uint32)) | (
        node_version[trained_nodes] != row_version[trained]
    )
    conflicts = int(np.unique(trained_nodes[disagree]).size)

    node_replay = {
        name: (
            np.concatenate([arrays[b.row][b.start : b.start + b.length] for b in order])
            if order
            else np.zeros((0, *arrays[0].shape[1:]), dtype=arrays[0].dtype)
        )
        for name, arrays in replay.items()
    }
    return PrefixTree(
        tokens=tokens,
        parent=parent,
        position_ids=position_ids,
        subtree_end=subtree_end,
        trained_rows=trained_rows,
        loss_mask=(trained_rows > 0).astype(np.uint8),
        logprobs=node_lps,
        weight_version=node_version,
        versions=list(versions),
        row_offsets=row_offsets,
        row_nodes=row_nodes,
        row_loss_mask=row_mask,
        row_logprobs=row_lps,
        row_weight_version=row_version,
        rewards=np.array([s.reward for s in samples], dtype=np.float32),
        response_lengths=np.array([s.response_length for s in samples], dtype=np.int64),
        row_sessions=[str(s.metadata.get("session_id", "")) for s in samples],
        block_offsets=offsets,
        block_parent=block_parent,
        label_conflicts=conflicts,
        row_metadata=[s.metadata for s in samples],
        **node_replay,
    )


def tree_stats(samples: Sequence[Sample]) -> TreeStats:
    """`build_prefix_tree(samples).stats` without building the node arrays."""
    replay = _replay_rows(samples)
    rows = _rows(samples, replay)
    root = _Block(-1, 0, 0, None)
    for r in range(len(rows)):
        _insert(root, rows, r)
    nodes = sum(b.length for b in _preorder(root))
    return TreeStats(len(rows), sum(len(r.tokens) for r in rows), nodes)


def _cat(parts: list[np.ndarray], dtype: type[np.generic]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
