"""The shared-prefix (tree) layout: the block-trie builder equals a token-by-token trie on
generated rows, the preorder mask equals the ancestors walked through `parent`, every row's
path gives back its sample exactly, and the tree trains what the rows train."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentrail.errors import TreeError
from tokentrail.trajectory.prefix_tree import (
    MAX_DENSE_TOKENS,
    PrefixTree,
    build_prefix_tree,
    tree_stats,
)
from tokentrail.trajectory.sample import Sample

SYSTEM = [101, 102, 103, 104]  # a shared system prompt
TASK = [201, 202]
SHAPE = (3, 2)  # replay rows: layers x top-k


def sample(
    tokens: list[int],
    response: int,
    *,
    sid: str = "s",
    reward: float = 0.0,
    experts: np.ndarray | None = None,
    versions: list[dict] | None = None,
    logprob: float = -0.5,
) -> Sample:
    mask = np.ones(response, dtype=np.uint8)
    metadata: dict = {"session_id": sid}
    if versions:
        metadata["weight_versions"] = versions
    return Sample(
        tokens=np.array(tokens, dtype=np.uint32),
        loss_mask=mask,
        rollout_log_probs=(logprob - 0.01 * np.arange(response)).astype(np.float32),
        response_length=response,
        reward=reward,
        metadata=metadata,
        routed_experts=experts,
    )


# --- The reference: one trie node per token --------------------------------------------------


def naive_tree(samples: list[Sample]) -> dict:
    """Token-by-token trie over (id, replay row) keys, numbered depth first in insertion order."""
    children: list[dict[bytes, int]] = [{}]  # node 0 is the root
    token_of, depth_of, parent_of = [0], [-1], [-1]
    paths = []
    for s in samples:
        cur, path = 0, []
        for p, tok in enumerate(s.tokens.tolist()):
            key = np.uint32(tok).tobytes()
            if s.routed_experts is not None:
                key += s.routed_experts[p].tobytes()
            nxt = children[cur].get(key)
            if nxt is None:
                nxt = len(token_of)
                children[cur][key] = nxt
                children.append({})
                token_of.append(tok)
                depth_of.append(p)
                parent_of.append(cur)
            path.append(nxt)
            cur = nxt
        paths.append(path)
    number: dict[int, int] = {}
    order: list[int] = []
    stack = list(reversed(children[0].values()))
    while stack:
        node = stack.pop()
        number[node] = len(order)
        order.append(node)
        stack.extend(reversed(children[node].values()))
    parent = [number[parent_of[n]] if parent_of[n] else -1 for n in order]
    return {
        "tokens": [token_of[n] for n in order],
        "position_ids": [depth_of[n] for n in order],
        "parent": parent,
        "paths": [[number[n] for n in path] for path in paths],
    }


def ancestors_mask(parent: np.ndarray) -> np.ndarray:
    """The slow mask: walk every node's parents."""
    n = len(parent)
    mask = np.zeros((n, n), dtype=bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = int(parent[j])
    return mask


def check_rows(tree: PrefixTree, samples: list[Sample]) -> None:
    """Every row's path gives back its sample: ids, positions, labels, replay rows."""
    for r, s in enumerate(samples):
        path = tree.row_path(r)
        n, resp = len(s.tokens), s.response_length
        assert np.array_equal(tree.tokens[path], s.tokens)
        assert np.array_equal(tree.position_ids[path], np.arange(n))
        assert np.all(tree.parent[path[1:]] == path[:-1])
        lo, hi = tree.row_offsets[r], tree.row_offsets[r + 1]
        assert np.array_equal(tree.row_loss_mask[lo:hi][n - resp :], s.loss_mask)
        assert not tree.row_loss_mask[lo:hi][: n - resp].any()
        assert np.array_equal(tree.row_logprobs[lo:hi][n - resp :], s.rollout_log_probs)
        if s.routed_experts is not None:
            assert tree.routed_experts is not None
            assert np.array_equal(tree.routed_experts[path], s.routed_experts)


# --- Generated rows ------------------------------------------------------------------------------


@st.composite
def row_sets(draw: st.DrawFn) -> list[Sample]:
    """Rows that share prefixes (each extends a prefix of an earlier one), some duplicates,
    some prefixes of others, some empty; replay rows that sometimes differ under equal ids."""
    with_experts = draw(st.booleans())
    rows: list[tuple[list[int], list[int]]] = []
    for _ in range(draw(st.integers(1, 7))):
        if rows and draw(st.booleans()):
            base_tokens, base_experts = draw(st.sampled_from(rows))
            cut = draw(st.integers(0, len(base_tokens)))
            tokens, experts = base_tokens[:cut], base_experts[:cut]
        else:
            tokens, experts = [], []
        extra = draw(st.integers(0, 12))
        tokens = tokens + draw(st.lists(st.integers(0, 3), min_size=extra, max_size=extra))
        experts = experts + draw(st.lists(st.integers(0, 1), min_size=extra, max_size=extra))
        rows.append((tokens, experts))
    out = []
    for i, (tokens, experts) in enumerate(rows):
        response = draw(st.integers(0, len(tokens)))
        rows_e = None
        if with_experts:
            rows_e = np.broadcast_to(
                np.array(experts, dtype=np.uint8)[:, None, None], (len(tokens), *SHAPE)
            ).copy()
        out.append(sample(tokens, response, sid=f"s{i % 3}", reward=float(i), experts=rows_e))
    return out


@settings(max_examples=300, deadline=None)
@given(row_sets())
def test_block_trie_equals_token_trie(samples: list[Sample]) -> None:
    tree = build_prefix_tree(samples)
    ref = naive_tree(samples)
    assert tree.tokens.tolist() == ref["tokens"]
    assert tree.position_ids.tolist() == ref["position_ids"]
    assert tree.parent.tolist() == ref["parent"]
    for r, path in enumerate(ref["paths"]):
        assert tree.row_path(r).tolist() == path
    assert tree.stats == tree_stats(samples)
    assert tree.stats.tree_tokens == len(ref["tokens"])
    assert np.array_equal(tree.attention_mask(), ancestors_mask(tree.parent))
    check_rows(tree, samples)
    # Blocks tile the nodes in order; a block's first node hangs under its parent's last.
    offsets, bparent = tree.block_offsets, tree.block_parent
    assert offsets[0] == 0 and offsets[-1] == tree.num_nodes and np.all(np.diff(offsets) > 0)
    for b in range(len(bparent)):
        first = offsets[b]
        want = offsets[bparent[b] + 1] - 1 if bparent[b] >= 0 else -1
        assert tree.parent[first] == want
        assert np.all(
            tree.parent[first + 1 : offsets[b + 1]] == np.arange(first, offsets[b + 1] - 1)
        )
    # Every row ends at the end of a block.
    ends = set(offsets[1:].tolist())
    for r in range(tree.num_rows):
        path = tree.row_path(r)
        assert not len(path) or int(path[-1]) + 1 in ends
    # Per session: the rows' tokens and the distinct nodes they use.
    for sid, stats in tree.session_stats().items():
        mine = [s for s in samples if s.metadata["session_id"] == sid]
        assert stats == tree_stats(mine)


@settings(max_examples=150, deadline=None)
@given(row_sets(), st.lists(st.floats(-2, 2), min_size=7, max_size=7))
def test_scattered_advantages_train_what_the_rows_train(
    samples: list[Sample], advantages: list[float]
) -> None:
    """A per-token loss `adv * f(logprob)` summed over the rows equals the tree's loss with
    every node weighted by the advantages of the rows that train it."""
    tree = build_prefix_tree(samples)
    adv = np.array(advantages[: len(samples)])
    node_f = np.sin(np.arange(tree.num_nodes) * 0.7)  # any function of the node's prefix
    per_row = tree.gather(node_f)
    rows_loss = sum(
        adv[r]
        * float(
            (per_row[r] * tree.row_loss_mask[tree.row_offsets[r] : tree.row_offsets[r + 1]]).sum()
        )
        for r in range(len(samples))
    )
    assert float((tree.scatter(adv) * node_f).sum()) == pytest.approx(rows_loss, abs=1e-9)
    assert np.array_equal(tree.loss_mask, (tree.trained_rows > 0).astype(np.uint8))
    assert int(tree.trained_rows.sum()) == int(tree.row_loss_mask.sum())


# --- Labels --------------------------------------------------------------------------------------


def test_a_group_shares_its_prompt_and_keeps_each_rows_labels() -> None:
    prompt = [*SYSTEM, *TASK]
    a = sample([*prompt, 301, 302, 2], 3, sid="a", reward=1.0, versions=[_v("w1", 6, 9)])
    b = sample([*prompt, 301, 303, 2], 3, sid="b", reward=0.0, versions=[_v("w2", 6, 9)])
    tree = build_prefix_tree([a, b])
    # The prompt and the first sampled token, which both rows sampled, once.
    assert tree.stats.row_tokens == 18 and tree.stats.tree_tokens == 7 + 2 + 2
    assert tree.tokens[:7].tolist() == [*prompt, 301]
    assert tree.trained_rows.tolist() == [0] * 6 + [2] + [1] * 4
    # The shared token has two versions: the first row's is the node's, and it is a conflict.
    assert tree.versions == ["w1", "w2"]
    assert tree.weight_version[6] == 0 and tree.label_conflicts == 1
    check_rows(tree, [a, b])
    assert tree.session_stats()["a"].tree_tokens == 9


def test_replay_rows_split_what_the_ids_share() -> None:
    """Equal ids routed to other experts are another computation: not merged."""
    tokens = [*SYSTEM, 301, 2]
    first = np.zeros((6, *SHAPE), dtype=np.uint8)
    second = first.copy()
    second[2, 1, 0] = 5
    tree = build_prefix_tree([sample(tokens, 2, experts=first), sample(tokens, 2, experts=second)])
    assert tree.stats.tree_tokens == 2 + 4 + 4
    assert tree.routed_experts is not None and tree.routed_experts.shape == (10, *SHAPE)


def _v(version: str, start: int, end: int) -> dict:
    return {"version": version, "start": start, "end": end, "trained": end - start}


# --- Bad input -----------------------------------------------------------------------------------


def test_bad_input_is_a_tree_error() -> None:
    experts = np.zeros((6, *SHAPE), dtype=np.uint8)
    with pytest.raises(TreeError, match="routed_experts: sample 1 has none"):
        build_prefix_tree([sample([*SYSTEM, 1, 2], 2, experts=experts), sample([1, 2], 1)])
    with pytest.raises(TreeError, match="more than one type or shape"):
        build_prefix_tree(
            [
                sample([*SYSTEM, 1, 2], 2, experts=experts),
                sample([*SYSTEM, 1, 2], 2, experts=experts.astype(np.int32)),
            ]
        )
    bad = sample([*SYSTEM, 1, 2], 2)
    bad.loss_mask = np.ones(3, dtype=np.uint8)
    with pytest.raises(TreeError, match="sample 0: 3 loss-mask"):
        build_prefix_tree([bad])
    tree = build_prefix_tree([sample([*SYSTEM, 1, 2], 2)])
    with pytest.raises(TreeError, match="one value per row"):
        tree.scatter([1.0, 2.0])
    with pytest.raises(TreeError, match="unknown tree mask 'sparse'; expected one of \\('dense'"):
        tree.to_torch("sparse")


def test_an_empty_group_is_an_empty_tree() -> None:
    tree = build_prefix_tree([])
    assert tree.num_nodes == 0 and tree.stats.ratio == 1.0
    assert tree.attention_mask().shape == (0, 0)


# --- Real sizes ----------------------------------------------------------------------------------


def test_a_group_of_eight_128k_rows() -> None:
    """Eight 128K-token rows sharing a 20K-token system prompt and tool list: the prefix once,
    and a dense mask refused (the flex block mask is the way at this size)."""
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 151_000, 20_000, dtype=np.uint32)
    samples = []
    for i in range(8):
        own = rng.integers(0, 151_000, 108_000, dtype=np.uint32)
        own[0] = 151_001 + i  # each rollout's first sampled token differs
        samples.append(sample(np.concatenate([shared, own]).tolist(), 100_000, sid=f"g{i}"))
    tree = build_prefix_tree(samples)
    assert tree.stats.row_tokens == 8 * 128_000
    assert tree.stats.tree_tokens == 20_000 + 8 * 108_000
    assert tree.block_parent.tolist() == [-1] + [0] * 8
    check_rows(tree, samples[:2])
    with pytest.raises(TreeError, match=f"limit {MAX_DENSE_TOKENS} tokens"):
        tree.attention_mask()


def test_moe_rows_at_real_shape() -> None:
    """48 layers x top-8 routed experts per token, 4 rows of 32K sharing 16K: rows equal up to
    one expert id deep in the prefix split there."""
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 151_000, 32_000, dtype=np.uint32)
    experts = rng.integers(0, 128, (32_000, 48, 8), dtype=np.uint8)
    samples = []
    for i in range(4):
        t, e = tokens.copy(), experts.copy()
        t[16_000:] = rng.integers(0, 151_000, 16_000, dtype=np.uint32)
        if i == 3:
            e[9_000, 47, 7] ^= 1  # routed differently at one token of the shared prefix
        samples.append(sample(t.tolist(), 16_000, experts=e))
    tree = build_prefix_tree(samples)
    assert tree.stats.tree_tokens == 16_000 + 3 * 16_000 + (32_000 - 9_000)
    check_rows(tree, samples)
