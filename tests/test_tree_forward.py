"""The tree layout as a trainer uses it: a tiny Qwen3 (transformers, seeded random weights,
float32, CPU) run once over a group's prefix tree gives every row token the hidden state,
logits and logprob it gets over its row alone, and a policy-gradient loss over the tree has the
rows' gradient.

The rows are real: simulated Claude Code sessions over loopback HTTP with the Qwen3 vocabulary,
one with two sub-agents and a compaction, and a group of rollouts of one task opened with one
group id. Positions are depths in the tree, the mask is ancestors (`subtree_end`).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from tokentrail.sim.harness import Behaviour, SessionSpec, simulate
from tokentrail.sim.model import SimulatedEngine
from tokentrail.storage.tree_pack import pack_tree, read_tree_pack, write_tree_pack
from tokentrail.text.families import resolve_family
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.ledger import Ledger
from tokentrail.trajectory.linearize import Trajectory
from tokentrail.trajectory.prefix_tree import PrefixTree, build_prefix_tree
from tokentrail.trajectory.sample import Sample

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 2e-5  # float32, the same weights; measured differences are ~1e-6
CHUNK = 256  # logits rows at a time: 256 x 151,936 floats is 155 MB


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin:qwen3")


@pytest.fixture(scope="module")
def qwen3():
    """Qwen3's architecture (RMSNorm, q/k norms, GQA, RoPE, SwiGLU) at toy width, its vocabulary."""
    return tiny_qwen3("sdpa")


def tiny_qwen3(attention: str):
    config = transformers.Qwen3Config(
        vocab_size=151_936,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=32_768,
        tie_word_embeddings=False,
        attn_implementation=attention,
    )
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def session(tokenizer) -> Trajectory:
    """A Claude Code-like session: two sub-agents and a compaction, its rows forked."""
    behaviour = replace(Behaviour(), subagents=True, compaction=True)
    spec = SessionSpec(seed=3, steps=4, subagents=2, context_tokens=300, answer_words=20)
    run = asyncio.run(simulate(tokenizer, behaviour=behaviour, spec=spec, rewrite_policy="fork"))
    assert run.result.subagent_runs == 2 and run.result.compactions == 1
    return run.trajectory


@pytest.fixture(scope="module")
def group(tokenizer) -> tuple[list[Sample], dict[str, Ledger]]:
    """Three rollouts of one task, opened in one group, sampled with their own seeds."""
    family = resolve_family(tokenizer, None)
    spec = SessionSpec(seed=5, steps=2, context_tokens=200, answer_words=20)
    samples, ledgers = [], {}
    for k in range(3):
        run = asyncio.run(
            simulate(
                tokenizer,
                spec=spec,
                engine=SimulatedEngine(tokenizer, family, seed=k),
                session_id=f"rollout-{k}",
                group="task-7",
            )
        )
        for s in run.trajectory.samples:
            s.reward = float(k)
        samples += run.trajectory.samples
        ledgers[f"rollout-{k}"] = run.trajectory.ledger
    return samples, ledgers


def forward(model, input_ids, position_ids=None, attention_mask=None):
    """Last hidden states `[n, d]` and a function giving the logits of some of them."""
    with torch.no_grad():
        out = model.model(
            input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask
        )
    return out.last_hidden_state[0]


def next_logprobs(model, hidden, targets) -> torch.Tensor:
    """log p(targets[i] | the prefix whose last hidden state is hidden[i]), in chunks."""
    out = []
    with torch.no_grad():
        for at in range(0, len(targets), CHUNK):
            logits = model.lm_head(hidden[at : at + CHUNK])
            lp = torch.log_softmax(logits, dim=-1)
            out.append(lp.gather(1, targets[at : at + CHUNK, None])[:, 0])
    return torch.cat(out) if out else torch.zeros(0)


def check_tree_equals_rows(model, samples: list[Sample], tree: PrefixTree) -> None:
    """Hidden states at every row token; logits and logprobs at 48 positions of each row
    (its last 16 and 32 drawn at random: a 151,936-id head is the slow part on a CPU)."""
    batch = tree.to_torch()
    hidden = forward(model, batch["input_ids"], batch["position_ids"], batch["attention_mask"])
    rng = np.random.default_rng(0)
    for r, s in enumerate(samples):
        ids = torch.from_numpy(s.tokens.astype(np.int64))
        alone = forward(model, ids[None])
        path = torch.from_numpy(tree.row_path(r).astype(np.int64))
        assert (hidden[path] - alone).abs().max().item() < TOLERANCE
        n = len(ids)
        at = np.unique(np.r_[rng.integers(1, n, 32), np.arange(max(1, n - 16), n)])
        at_t = torch.from_numpy(at)
        # A node's token is predicted from its parent's state: the parent is the row's
        # previous token.
        parents = torch.from_numpy(tree.parent.astype(np.int64))[path[at_t]]
        assert torch.equal(parents, path[at_t - 1])
        tree_lp = next_logprobs(model, hidden[parents], ids[at_t])
        row_lp = next_logprobs(model, alone[at_t - 1], ids[at_t])
        assert (tree_lp - row_lp).abs().max().item() < TOLERANCE
        with torch.no_grad():
            diff = model.lm_head(hidden[parents[-16:]]) - model.lm_head(alone[at_t[-16:] - 1])
        assert diff.abs().max().item() < TOLERANCE


def test_a_session_with_sub_agents_and_a_compaction(qwen3, session) -> None:
    tree = build_prefix_tree(session.samples)
    # Four conversations (the main one before and after its compaction, two sub-agents).
    assert tree.num_rows == 4
    assert tree.stats.tree_tokens < tree.stats.row_tokens
    # The ledger's figure is the tree's.
    assert session.ledger.layout == tree.stats
    assert session.ledger.to_dict()["layout"]["tree_tokens"] == tree.num_nodes
    check_tree_equals_rows(qwen3, session.samples, tree)


def test_a_group_merges_at_its_shared_prompt(qwen3, group, tmp_path) -> None:
    group, ledgers = group
    packed = pack_tree(group)
    assert list(packed.trees) == ["task-7"]
    tree = packed.trees["task-7"]
    # Every sample carries the group its session was opened in; each session's own figures
    # in the group's tree are its ledger's.
    assert {s.metadata["group"] for s in group} == {"task-7"}
    assert packed.session_stats() == {sid: ledger.layout for sid, ledger in ledgers.items()}
    # The task prompt (system prompt, tools, task) is shared: the first rows diverge after it.
    prompt = min(s.prompt_length for s in group)
    assert tree.stats.tree_tokens <= tree.stats.row_tokens - (len(group) - 1) * prompt
    # What the file holds is what was packed.
    write_tree_pack(tmp_path / "group.npz", packed)
    back = read_tree_pack(tmp_path / "group.npz").trees["task-7"]
    for name in ("tokens", "parent", "subtree_end", "row_nodes", "row_loss_mask", "rewards"):
        assert np.array_equal(getattr(back, name), getattr(tree, name))
    assert back.row_sessions == tree.row_sessions and back.stats == tree.stats
    check_tree_equals_rows(qwen3, group, back)


def test_a_policy_gradient_step_over_the_tree_is_the_rows_step(group) -> None:
    """REINFORCE with per-row advantages: the tree's loss (node weights from `scatter`) and
    its gradient equal the rows' summed over rows."""
    group = [trained_at_most(s, 48) for s in group[0]]
    tree = build_prefix_tree(group)
    rewards = tree.rewards.astype(np.float64)
    advantages = rewards - rewards.mean()

    def rows_loss(model):
        total = 0.0
        for r, s in enumerate(group):
            ids = torch.from_numpy(s.tokens.astype(np.int64))
            hidden = model.model(input_ids=ids[None]).last_hidden_state[0]
            at = torch.from_numpy(np.flatnonzero(s.loss_mask) + s.prompt_length)
            logits = model.lm_head(hidden[at - 1])
            lp = torch.log_softmax(logits, -1).gather(1, ids[at, None])[:, 0]
            total = total - advantages[r] * lp.sum()
        return total

    def tree_loss(model):
        batch = tree.to_torch()
        hidden = model.model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=batch["attention_mask"],
        ).last_hidden_state[0]
        # Each trained node once, predicted from its parent's state, weighted by the
        # advantages of the rows that train it.
        nodes = torch.from_numpy(np.flatnonzero(tree.loss_mask))
        parent = torch.from_numpy(tree.parent.astype(np.int64))[nodes]
        logits = model.lm_head(hidden[parent])
        lp = torch.log_softmax(logits, -1).gather(1, batch["input_ids"][0, nodes, None])[:, 0]
        weight = torch.from_numpy(tree.scatter(advantages).astype(np.float32))[nodes]
        return -(weight * lp).sum()

    grads = []
    for loss_of in (rows_loss, tree_loss):
        model = tiny_qwen3("sdpa")
        loss = loss_of(model)
        loss.backward()
        grads.append((float(loss), [p.grad.clone() for p in model.parameters()]))
    (rows, g_rows), (tree_l, g_tree) = grads
    assert tree_l == pytest.approx(rows, rel=1e-4, abs=1e-3)
    for a, b in zip(g_rows, g_tree, strict=True):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-5)


def trained_at_most(sample: Sample, n: int) -> Sample:
    """`sample` training only its first `n` trained tokens (the loss's cost is the head's)."""
    mask = sample.loss_mask.copy()
    mask[np.flatnonzero(mask)[n:]] = 0
    return replace(sample, loss_mask=mask)


def test_the_flex_block_mask_is_the_dense_mask(group) -> None:
    group, _ = group
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    tree = build_prefix_tree(group)
    block = tree.to_torch("flex", block_size=128)["block_mask"]
    dense = flex.create_mask(block.mask_mod, None, None, tree.num_nodes, tree.num_nodes, "cpu")
    assert torch.equal(dense[0, 0], torch.from_numpy(tree.attention_mask()))
    # Blocks wholly outside the tree are skipped: the tree's sparsity, not the causal one.
    assert block.sparsity() > 50.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex attention is compiled for GPU")
def test_flex_attention_over_the_tree_equals_the_rows(group) -> None:
    group, _ = group
    model = tiny_qwen3("flex_attention").cuda()
    tree = build_prefix_tree(group)
    batch = tree.to_torch("flex", device="cuda")
    hidden = forward(model, batch["input_ids"], batch["position_ids"], batch["block_mask"])
    for r, s in enumerate(group):
        ids = torch.from_numpy(s.tokens.astype(np.int64)).cuda()
        alone = forward(model, ids[None])
        path = torch.from_numpy(tree.row_path(r).astype(np.int64)).cuda()
        assert (hidden[path] - alone).abs().max().item() < 1e-4
