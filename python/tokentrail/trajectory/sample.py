"""The training sample a trainer consumes, with slime's field names.

`tokens` is the whole sequence (prompt included); `loss_mask` and `rollout_log_probs` cover the
last `response_length` tokens, so a slime/TRL-style trainer can use it as is. `routed_experts`
and `indexer_topk`, when kept, hold one row `[layers, k]` per token; `metadata["replay"]` says
how many rows are present and why the others are not, `metadata["weight_versions"]` which
weights sampled the trained tokens. `metadata["constrained"]` holds the response's stretches
`[start, end)` (response positions, as `loss_mask`'s) sampled under a structured-output
grammar, `constrained` the same as a per-token mask; `metadata["length_truncated"]` says a
turn of the sample was cut by its `max_tokens`.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import numpy.typing as npt

from tokentrail.core.ids import LogprobArray, MaskArray, RowArray, TokenArray
from tokentrail.kinds import Replay
from tokentrail.trajectory.ledger import ReplayCoverage
from tokentrail.trajectory.tree import Node

if TYPE_CHECKING:
    from tokentrail import _core

# `to_dict` writes a replay array as its dtype, shape and nested values.
REPLAY_FIELDS = ("routed_experts", "indexer_topk")


class MultimodalInputs(TypedDict):
    """`Sample.multimodal_inputs`: slime's `multimodal_inputs`, verl's `multi_modal_data`."""

    images: list[bytes]
    image_grid_thw: npt.NDArray[np.int64]
    image_offsets: list[int]


class TrainedVersion(TypedDict):
    """A trained stretch `[start, end)` of a sample's tokens sampled by weights `version`."""

    version: str
    start: int
    end: int
    trained: int


@dataclass
class Sample:
    tokens: TokenArray
    loss_mask: MaskArray
    rollout_log_probs: LogprobArray
    response_length: int
    reward: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    # `[len(tokens), layers, top_k]` expert ids; `[len(tokens), layers, index_topk]` indices.
    routed_experts: RowArray | None = None
    indexer_topk: RowArray | None = None

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    def multimodal_inputs(self) -> MultimodalInputs | None:
        """The sample's images as slime's `Sample.multimodal_inputs` and verl's
        `multi_modal_data` hold them, with the processor's grid: `images` (encoded bytes, in
        token order), `image_grid_thw` (`[n, 3]`), `image_offsets` (where each image's
        placeholder tokens start in `tokens`). None for a sample without images."""
        images = self.metadata.get("images")
        if not images:
            return None
        return {
            "images": [base64.b64decode(i["data"]) for i in images],
            "image_grid_thw": np.asarray([i["image_grid_thw"] for i in images], dtype=np.int64),
            "image_offsets": [int(i["offset"]) for i in images],
        }

    @property
    def constrained(self) -> MaskArray:
        """`[response_length]` uint8: 1 where the token was sampled under a structured-output
        grammar (a forced tool call), its logprob the grammar's, not the policy's."""
        mask = np.zeros(self.response_length, dtype=np.uint8)
        for start, end in self.metadata.get("constrained") or ():
            mask[int(start) : int(end)] = 1
        return mask

    @property
    def trained_tokens(self) -> int:
        return int(np.count_nonzero(self.loss_mask))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: arrays become lists; a replay array `{"dtype", "shape", "values"}`."""
        d: dict[str, Any] = {
            "tokens": self.tokens.tolist(),
            "loss_mask": self.loss_mask.tolist(),
            "rollout_log_probs": self.rollout_log_probs.tolist(),
            "response_length": self.response_length,
            "reward": self.reward,
            "metadata": self.metadata,
        }
        for name in REPLAY_FIELDS:
            rows = getattr(self, name)
            if rows is not None:
                d[name] = {
                    "dtype": str(rows.dtype),
                    "shape": list(rows.shape),
                    "values": rows.tolist(),
                }
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        replay = {}
        for name in REPLAY_FIELDS:
            if d.get(name) is not None:
                r = d[name]
                values = np.asarray(r["values"], dtype=np.dtype(r["dtype"]))
                replay[name] = values.reshape(tuple(int(n) for n in r["shape"]))
        return cls(
            tokens=np.asarray(d["tokens"], dtype=np.uint32),
            loss_mask=np.asarray(d["loss_mask"], dtype=np.uint8),
            rollout_log_probs=np.asarray(d["rollout_log_probs"], dtype=np.float32),
            response_length=int(d["response_length"]),
            reward=float(d["reward"]),
            metadata=dict(d.get("metadata") or {}),
            **replay,
        )

    def to_torch(self) -> dict[str, Any]:
        """Tensors for a trainer: int64 tokens, int32 mask, float32 logprobs; replay rows as
        they are held (uint8 or int32 shares memory, uint16 and uint32 too on torch >= 2.3)."""
        import torch

        tensors = {
            "tokens": torch.from_numpy(self.tokens.astype(np.int64)),
            "loss_mask": torch.from_numpy(self.loss_mask.astype(np.int32)),
            "rollout_log_probs": torch.from_numpy(self.rollout_log_probs),
            "response_length": self.response_length,
            "reward": self.reward,
            "constrained": torch.from_numpy(self.constrained.astype(np.int32)),
        }
        for name in REPLAY_FIELDS:
            rows = getattr(self, name)
            if rows is not None:
                tensors[name] = torch.from_numpy(rows)
        return tensors


# A session's rows on a channel: `(channel, turn, length)` to rows `[length, layers, k]` and one
# `REPLAY_STATUS` code per position, as `TurnStore.routed_experts` answers.
RowRead = Callable[[Replay, int, int], tuple[RowArray, MaskArray]]


def store_rows(store: _core.TurnStore) -> RowRead:
    """The rows a store keeps on its tapes."""

    def read(channel: Replay, turn: int, length: int) -> tuple[RowArray, MaskArray]:
        tape = store.routed_experts if channel is Replay.ROUTED_EXPERTS else store.indexer_topk
        return tape(turn, length)

    return read


def replay_rows(
    sample: Sample,
    built: _core.BuiltSample,
    read: RowRead,
    channels: Sequence[Replay],
    names: Sequence[str],
) -> None:
    """Give `sample` its replay rows and their coverage (`metadata["replay"]`).

    A sample's tokens are its last turn's prompt and output (cut short when truncated), so its
    rows are that turn's, each taken from the turn that computed the token; `names` are the
    core's `REPLAY_STATUS`.
    """
    if not channels:
        return
    last, n = built.turns[-1], len(sample.tokens)
    coverage = {}
    for channel in channels:
        rows, status = read(channel, last, n)
        setattr(sample, str(channel), rows)
        coverage[str(channel)] = ReplayCoverage.of(status, names).to_dict()
    sample.metadata["replay"] = coverage


def trained_versions(
    built: _core.BuiltSample, loss_mask: MaskArray, nodes: Sequence[Node]
) -> list[TrainedVersion]:
    """The weight version of every trained stretch of `built` (whose sample trains
    `loss_mask`), in `tokens` positions: `{"version", "start", "end", "trained"}`, the last the
    trained tokens it holds."""
    response_start = len(built.tokens) - len(loss_mask)
    by_turn = {n.turn.id: n.turn for n in nodes if n.turn is not None}
    out: list[TrainedVersion] = []
    for span in built.spans:
        turn = by_turn.get(span.turn)
        if turn is None:
            continue
        for version in turn.weight_versions:
            start = span.start + version.start
            end = min(span.start + version.end, span.end)
            if start >= end:
                continue
            trained = int(loss_mask[start - response_start : end - response_start].sum())
            if trained:
                out.append(
                    {"version": version.version, "start": start, "end": end, "trained": trained}
                )
    return out
