"""The training sample a trainer consumes, with slime's field names.

`tokens` is the whole sequence (prompt included); `loss_mask` and `rollout_log_probs` cover the
last `response_length` tokens, so a slime/TRL-style trainer can use it as is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Sample:
    tokens: np.ndarray
    loss_mask: np.ndarray
    rollout_log_probs: np.ndarray
    response_length: int
    reward: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def trained_tokens(self) -> int:
        return int(np.count_nonzero(self.loss_mask))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: arrays become lists."""
        return {
            "tokens": self.tokens.tolist(),
            "loss_mask": self.loss_mask.tolist(),
            "rollout_log_probs": self.rollout_log_probs.tolist(),
            "response_length": self.response_length,
            "reward": self.reward,
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        return cls(
            tokens=np.asarray(d["tokens"], dtype=np.uint32),
            loss_mask=np.asarray(d["loss_mask"], dtype=np.uint8),
            rollout_log_probs=np.asarray(d["rollout_log_probs"], dtype=np.float32),
            response_length=int(d["response_length"]),
            reward=float(d["reward"]),
            metadata=dict(d.get("metadata") or {}),
        )

    def to_torch(self) -> dict[str, Any]:
        """Tensors for a trainer: int64 tokens, int32 mask, float32 logprobs."""
        import torch

        return {
            "tokens": torch.from_numpy(self.tokens.astype(np.int64)),
            "loss_mask": torch.from_numpy(self.loss_mask.astype(np.int32)),
            "rollout_log_probs": torch.from_numpy(self.rollout_log_probs),
            "response_length": self.response_length,
            "reward": self.reward,
        }
