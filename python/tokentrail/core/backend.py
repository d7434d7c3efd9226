"""Selects the hot-path implementation: the Rust core or the pure-Python reference.

The core's surface is said once, in `tokentrail/_core.pyi`; the reference has the same names,
semantics and shapes (the differential tests hold the two together), so `Core` types both as
the stub declares them. `TOKENTRAIL_BACKEND` picks one for a whole process, and the `backend=`
argument of `TrajectoryManager`, `IncrementalEncoder` and `pack_samples` picks one per call site.
With "python" the extension module is never imported.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tokentrail.errors import PolicyError
from tokentrail.kinds import Backend, parse_kind

ENV_VAR = "TOKENTRAIL_BACKEND"

__all__ = ["ENV_VAR", "Core", "load_backend"]


class Core:
    """One implementation of the hot path, each name typed as `_core.pyi` declares it."""

    def __init__(self, backend: Backend) -> None:
        # The type checker reads only the first branch: every name below has the stub's type.
        if TYPE_CHECKING or backend is Backend.RUST:
            from tokentrail import _core as impl
        else:
            from tokentrail.core import reference as impl
        self.backend = backend
        self.POLICIES = impl.POLICIES
        self.REPLAY_STATUS = impl.REPLAY_STATUS
        self.TurnStore = impl.TurnStore
        self.IncrementalTokenizer = impl.IncrementalTokenizer
        self.Detokenizer = impl.Detokenizer
        self.common_prefix_len = impl.common_prefix_len
        self.linearize = impl.linearize
        self.pack = impl.pack
        self.index_body = impl.index_body
        self.diff_bodies = impl.diff_bodies
        self.number_array = impl.number_array
        self.sglang_run = impl.sglang_run
        self.sse_run = impl.sse_run
        self.http_chunks = impl.http_chunks

    def __repr__(self) -> str:
        return f"Core({self.backend.value!r})"


_LOADED: dict[Backend, Core] = {}


def load_backend(name: Backend | str | None = None) -> Core:
    """The Rust core (`"rust"`, the default) or the reference (`"python"`); `None` reads
    `TOKENTRAIL_BACKEND`."""
    chosen = name if name is not None else os.environ.get(ENV_VAR, Backend.RUST)
    backend = parse_kind(Backend, chosen, "backend", PolicyError)
    core = _LOADED.get(backend)
    if core is None:
        core = _LOADED[backend] = Core(backend)
    return core
