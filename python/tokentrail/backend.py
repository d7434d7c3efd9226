"""Selects the hot-path implementation: the Rust core or the pure-Python reference.

Both expose the same functions with the same semantics; `TOKENTRAIL_BACKEND` picks one for a
whole process, and the `backend=` argument of `TrajectoryManager` picks one per manager.
"""

from __future__ import annotations

import os
from types import ModuleType

from tokentrail.errors import PolicyError

BACKENDS = ("rust", "python")
ENV_VAR = "TOKENTRAIL_BACKEND"


def load_backend(name: str | None = None) -> ModuleType:
    name = name if name is not None else os.environ.get(ENV_VAR, "rust")
    if name == "rust":
        from tokentrail import _core

        return _core
    if name == "python":
        from tokentrail import reference

        return reference
    raise PolicyError(f"unknown backend {name!r}; expected one of {BACKENDS}")


def backend_name(module: ModuleType) -> str:
    return "python" if module.__name__.endswith("reference") else "rust"
