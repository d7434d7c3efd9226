"""The packed batch: samples flattened into one batch for variable-length attention, as
`pack` (the Rust core's or the reference's) lays them out and a trainer reads them."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from tokentrail.core.ids import LogprobArray, MaskArray, RowArray, TokenArray

if TYPE_CHECKING:
    from tokentrail import _core

__all__ = ["PackedBatch"]


@dataclass
class PackedBatch:
    """Samples flattened into one batch for variable-length attention (FlashAttention's varlen
    kernels, `position_ids`-based packing in transformers).

    Per packed token: `tokens` (uint32, as the core holds ids), `position_ids` (int32,
    restarting at 0 in each sample), `sample_index` (int32, the token's sample), `loss_mask`
    (uint8, 0 on prompts) and `logprobs` (float32, 0 on prompts). Per sample: `rewards` and
    `advantages` (float32; advantages are zeros for the trainer to fill in place).
    `cu_seqlens` (int32, samples + 1 entries from 0) and `max_seqlen` are FlashAttention's.
    """

    tokens: TokenArray
    cu_seqlens: npt.NDArray[np.int32]
    position_ids: npt.NDArray[np.int32]
    sample_index: npt.NDArray[np.int32]
    loss_mask: MaskArray
    logprobs: LogprobArray
    rewards: npt.NDArray[np.float32]
    advantages: npt.NDArray[np.float32]
    max_seqlen: int
    # `[tokens, layers, k]` in the samples' own type, when every sample carries them.
    routed_experts: RowArray | None = None
    indexer_topk: RowArray | None = None

    @property
    def num_samples(self) -> int:
        return len(self.rewards)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def to_torch(self) -> dict[str, Any]:
        """Tensors for a trainer, sharing memory with these arrays except `tokens`.

        `tokens` becomes int64 (a copy: torch indexes embeddings with int64, and its uint32
        support is thin). The int32, uint8 and float32 arrays, and the replay rows in their own
        type, are wrapped by `torch.from_numpy` without a copy, so writing `advantages` through
        the tensor writes this batch too. Replay rows are absent when not carried.
        """
        import torch

        tensors: dict[str, Any] = {"tokens": torch.from_numpy(self.tokens.astype(np.int64))}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ("tokens", "max_seqlen") and value is not None:
                tensors[f.name] = torch.from_numpy(value)
        tensors["max_seqlen"] = self.max_seqlen
        return tensors

    @classmethod
    def of(cls, packed: _core.Packed | PackedBatch) -> PackedBatch:
        """The batch the Rust core's `Packed` holds (its arrays, not copies)."""
        if isinstance(packed, PackedBatch):
            return packed
        return cls(**{f.name: getattr(packed, f.name) for f in fields(cls)})
