"""A `PackedBatch` consumed the way an RL trainer consumes it, with torch.

A session with routing replay is recorded, linearized and packed; a tiny MoE model runs over the
packed tokens with attention bounded by `cu_seqlens` (a block-diagonal causal mask), routes
every token to the experts the engine reported (`routed_experts`), and takes a PPO-style step:
the importance ratio against `rollout_log_probs`, the loss over `loss_mask` only. Where
`to_torch` promises to share memory, the tensors are the batch's arrays.
"""

from __future__ import annotations

import numpy as np
import pytest

from tokens import assistant, prompt_ids, sampled, system, tool, user
from tokentrail import TrajectoryManager, TurnRecord
from tokentrail.core.routing import ReplayRows, RoutingShape
from tokentrail.sim.moe import KVRouting
from tokentrail.storage.export import PackedBatch, pack_samples
from tokentrail.trajectory.sample import Sample

torch = pytest.importorskip("torch")

SHAPE = RoutingShape(2, 2, 8)
VOCAB = 512  # the readable fixture ids stay below it
DIM = 16


def session(backend: str) -> list[Sample]:
    """Three turns of one conversation and a sub-agent branch: two samples."""
    kv = KVRouting(SHAPE)
    manager = TrajectoryManager(backend=backend, routing=SHAPE)
    convo = [system("sys"), user("fix the parser")]
    turns = [
        (convo, assistant("reading", ("Read", {"f": "p.py"}))),
        ([*convo, assistant("reading", ("Read", {"f": "p.py"})), tool("def p(): ...")],
         assistant("editing", ("Edit", {"f": "p.py"}))),
        ([system("sys"), user("survey the tests")], assistant("three tests")),
    ]  # fmt: skip
    for tag, (history, reply) in enumerate(turns):
        prompt, output = prompt_ids(history), sampled(reply)
        start = manager.replay_start("s", history, prompt, None)
        rows, _ = kv.serve(prompt, output, start, tag)
        logprobs = [-0.5 - 0.01 * i for i in range(len(output))]
        manager.record_turn(
            "s",
            turn=TurnRecord(
                prompt, output, "stop", logprobs, routed_experts=ReplayRows(rows, start)
            ),
            prompt_messages=history,
            response_message=reply,
        )
    samples = manager.finish("s", reward=1.0).samples
    samples[1].reward = -1.0
    return samples


class TinyMoE(torch.nn.Module):
    """Embedding, one attention layer over the packed tokens, `layers` MoE layers whose experts
    are the replayed ones, and an LM head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.position = torch.nn.Embedding(256, DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        layers, _, experts = SHAPE.dims
        self.experts = torch.nn.Parameter(0.2 * torch.randn(layers, experts, DIM, DIM))
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, batch: dict) -> torch.Tensor:
        x = self.embed(batch["tokens"]) + self.position(batch["position_ids"].long())
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = (q @ k.T) / DIM**0.5
        scores = scores.masked_fill(~varlen_causal_mask(batch["cu_seqlens"]), float("-inf"))
        x = x + torch.softmax(scores, dim=-1) @ v
        routed = batch["routed_experts"].long()  # [tokens, layers, top_k]
        for layer in range(routed.shape[1]):
            chosen = self.experts[layer][routed[:, layer]]  # [tokens, top_k, dim, dim]
            x = x + torch.einsum("td,tkde->te", x, chosen) / routed.shape[2]
        return self.head(x)


def varlen_causal_mask(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Token i may attend to token j iff both lie in one sample and j <= i."""
    total = int(cu_seqlens[-1])
    positions = torch.arange(total)
    sample = torch.searchsorted(cu_seqlens[1:].long(), positions, right=True)
    same = sample[:, None] == sample[None, :]
    return same & (positions[None, :] <= positions[:, None])


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(token i | tokens before it), aligned with the tokens (0 for the first)."""
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, tokens[1:, None])[:, 0]
    return torch.cat([logp.new_zeros(1), logp])


def ppo_loss(batch: dict, logits: torch.Tensor, clip: float = 0.2) -> torch.Tensor:
    mask = batch["loss_mask"].float()
    logp = token_logprobs(logits, batch["tokens"])
    ratio = torch.exp(logp - batch["logprobs"])
    advantages = batch["advantages"][batch["sample_index"].long()]
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
    return -(surrogate * mask).sum() / mask.sum()


@pytest.fixture(params=["rust", "python"])
def packed(request) -> tuple[PackedBatch, dict, list[Sample]]:
    samples = session(request.param)
    batch = pack_samples(samples, backend=request.param)
    return batch, batch.to_torch(), samples


def test_to_torch_shares_the_batch_memory_where_it_promises(packed) -> None:
    batch, tensors, _ = packed
    shared = ["cu_seqlens", "position_ids", "sample_index", "loss_mask", "logprobs"]
    for name in [*shared, "rewards", "advantages", "routed_experts"]:
        assert tensors[name].data_ptr() == getattr(batch, name).ctypes.data, name
    assert tensors["routed_experts"].dtype == torch.uint8
    assert tuple(tensors["routed_experts"].shape) == (batch.num_tokens, 2, 2)
    assert tensors["tokens"].dtype == torch.int64, "a copy, for the embedding"
    # A trainer fills advantages in place; the batch sees them.
    tensors["advantages"].copy_(tensors["rewards"] - tensors["rewards"].mean())
    assert batch.advantages.tolist() == [1.0, -1.0]


def test_attention_stays_inside_each_sample(packed) -> None:
    batch, tensors, _ = packed
    model = TinyMoE()
    with torch.no_grad():
        before = model(tensors)
        changed = dict(tensors, tokens=tensors["tokens"].clone())
        second = slice(int(batch.cu_seqlens[1]), int(batch.cu_seqlens[2]))
        changed["tokens"][second] = (changed["tokens"][second] + 1) % VOCAB
        after = model(changed)
    first = slice(0, int(batch.cu_seqlens[1]))
    assert torch.equal(before[first], after[first]), "sample 0 never sees sample 1"
    assert not torch.equal(before[second], after[second])


def test_the_replayed_routing_is_the_function_computed(packed) -> None:
    _, tensors, _ = packed
    model = TinyMoE()
    with torch.no_grad():
        replayed = model(tensors)
        rerouted = dict(tensors, routed_experts=(tensors["routed_experts"] + 1) % 8)
        assert not torch.allclose(replayed, model(rerouted))


def test_a_ppo_step_trains_only_the_masked_in_tokens(packed) -> None:
    batch, tensors, samples = packed
    # A positive advantage everywhere: an untrained model's ratios lie far below 1 - clip, where
    # PPO's objective is unclipped, so every trained token must get gradient.
    tensors["advantages"].fill_(1.0)
    # Every sample starts with prompt: the shift that predicts a sample's first token from the
    # previous sample's last one is never trained.
    assert batch.loss_mask[batch.cu_seqlens[:-1]].tolist() == [0, 0]
    model = TinyMoE()
    logits = model(tensors)
    logits.retain_grad()
    loss = ppo_loss(tensors, logits)
    loss.backward()
    assert torch.isfinite(loss)
    # Logits at position i predict token i + 1: only those before a trained token get gradient.
    trains_next = np.zeros(batch.num_tokens, dtype=bool)
    trains_next[:-1] = batch.loss_mask[1:] == 1
    grad = logits.grad.abs().sum(dim=-1).numpy()
    assert (grad[~trains_next] == 0).all() and (grad[trains_next] > 0).all()
    # The experts a token was routed to get gradient; the rest of the layer's do not.
    used = set(np.unique(batch.routed_experts[:, 0]).tolist())
    touched = model.experts.grad[0].abs().sum(dim=(1, 2)) > 0
    assert {e for e in range(8) if touched[e]} <= used
    # The ratio is against the rollout's logprobs, on the trained tokens.
    with torch.no_grad():
        logp = token_logprobs(logits, tensors["tokens"])
    trained = tensors["loss_mask"].bool()
    assert torch.equal(
        tensors["logprobs"][trained],
        torch.from_numpy(np.concatenate([s.rollout_log_probs[s.loss_mask == 1] for s in samples])),
    )
    assert torch.isfinite(torch.exp(logp[trained] - tensors["logprobs"][trained])).all()


def test_a_sample_alone_gives_the_same_tensors(packed) -> None:
    batch, tensors, samples = packed
    alone = samples[0].to_torch()
    n = len(samples[0].tokens)
    assert torch.equal(alone["tokens"], tensors["tokens"][:n])
    assert alone["routed_experts"].data_ptr() == samples[0].routed_experts.ctypes.data
    assert torch.equal(alone["routed_experts"], tensors["routed_experts"][:n])
