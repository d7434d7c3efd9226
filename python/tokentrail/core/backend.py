"""Selects the hot-path implementation: the Rust core or the pure-Python reference.

Both expose the same functions with the same semantics (`CoreBackend` is that surface, so
results are typed whichever runs); `TOKENTRAIL_BACKEND` picks one for a whole process, and the
`backend=` argument of `TrajectoryManager` and `pack_samples` picks one per call site.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tokentrail.errors import PolicyError
from tokentrail.kinds import Backend, parse_kind

ENV_VAR = "TOKENTRAIL_BACKEND"


class BuiltSampleLike(Protocol):
    @property
    def tokens(self) -> npt.NDArray[np.uint32]: ...
    @property
    def loss_mask(self) -> npt.NDArray[np.uint8]: ...
    @property
    def logprobs(self) -> npt.NDArray[np.float32]: ...
    @property
    def truncated(self) -> bool: ...
    @property
    def turns(self) -> list[int]: ...
    @property
    def spans(self) -> Sequence[SpanLike]: ...
    @property
    def chain(self) -> int: ...


class SpanLike(Protocol):
    @property
    def turn(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...


class DriftEventLike(Protocol):
    @property
    def chain(self) -> int: ...
    @property
    def turn(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def at(self) -> int: ...
    @property
    def drifted(self) -> int: ...


class LinearizedLike(Protocol):
    @property
    def samples(self) -> Sequence[BuiltSampleLike]: ...
    @property
    def drifts(self) -> Sequence[DriftEventLike]: ...
    @property
    def trained(self) -> dict[int, int]: ...
    @property
    def realigned(self) -> dict[int, int]: ...
    @property
    def truncated(self) -> dict[int, int]: ...


Rows = npt.NDArray[Any]


class TurnStoreLike(Protocol):
    def __len__(self) -> int: ...
    @property
    def routed_experts_shape(self) -> tuple[int, int, int] | None: ...
    @property
    def indexer_topk_shape(self) -> tuple[int, int] | None: ...
    def push(
        self,
        parent: int,
        prompt_ids: Any,
        output_ids: Any,
        logprobs: Any = None,
        *,
        routed_experts: Any = None,
        indexer_topk: Any = None,
    ) -> int: ...
    def replay_start(self, parent: int, prompt_ids: Any) -> int: ...
    def routed_experts(
        self, turn: int, length: int | None = None
    ) -> tuple[Rows, npt.NDArray[np.uint8]]: ...
    def indexer_topk(
        self, turn: int, length: int | None = None
    ) -> tuple[Rows, npt.NDArray[np.uint8]]: ...
    def prompt_ids(self, turn: int) -> npt.NDArray[np.uint32]: ...
    def tokens(self, turn: int) -> npt.NDArray[np.uint32]: ...
    def output_ids(self, turn: int) -> npt.NDArray[np.uint32]: ...
    def logprobs(self, turn: int) -> npt.NDArray[np.float32] | None: ...
    def output_len(self, turn: int) -> int: ...
    def nbytes(self) -> int: ...
    def heap_bytes(self) -> int: ...
    def linearize(
        self,
        chains: Sequence[Sequence[int]],
        *,
        policy: str = ...,
        fork_threshold: int = ...,
        max_sample_tokens: int = ...,
    ) -> LinearizedLike: ...


class PackedLike(Protocol):
    @property
    def tokens(self) -> npt.NDArray[np.uint32]: ...
    @property
    def cu_seqlens(self) -> npt.NDArray[np.int32]: ...
    @property
    def position_ids(self) -> npt.NDArray[np.int32]: ...
    @property
    def sample_index(self) -> npt.NDArray[np.int32]: ...
    @property
    def loss_mask(self) -> npt.NDArray[np.uint8]: ...
    @property
    def logprobs(self) -> npt.NDArray[np.float32]: ...
    @property
    def rewards(self) -> npt.NDArray[np.float32]: ...
    @property
    def advantages(self) -> npt.NDArray[np.float32]: ...
    @property
    def max_seqlen(self) -> int: ...
    @property
    def routed_experts(self) -> Rows | None: ...
    @property
    def indexer_topk(self) -> Rows | None: ...


class CoreBackend(Protocol):
    """What the manager and the exporters use of a hot-path implementation."""

    # Read-only, as a module's constants are.
    @property
    def POLICIES(self) -> tuple[str, ...]: ...  # noqa: N802
    @property
    def REPLAY_STATUS(self) -> tuple[str, ...]: ...  # noqa: N802

    def TurnStore(  # noqa: N802 - the class, called as a factory
        self,
        *,
        routed_experts: tuple[int, int, int] | None = None,
        indexer_topk: tuple[int, int] | None = None,
    ) -> TurnStoreLike: ...
    def common_prefix_len(self, a: Any, b: Any) -> int: ...
    def pack(
        self,
        tokens: Sequence[Any],
        loss_masks: Sequence[Any],
        logprobs: Sequence[Any],
        response_lengths: Any,
        rewards: Any,
        routed_experts: Sequence[Any] | None = None,
        indexer_topk: Sequence[Any] | None = None,
    ) -> PackedLike: ...


def load_backend(name: Backend | str | None = None) -> CoreBackend:
    """The Rust core (`"rust"`, the default) or the reference (`"python"`)."""
    chosen = name if name is not None else os.environ.get(ENV_VAR, Backend.RUST)
    backend = parse_kind(Backend, chosen, "backend", PolicyError)
    if backend is Backend.RUST:
        from tokentrail import _core

        return _core
    from tokentrail.core import reference

    return reference
