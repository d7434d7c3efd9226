"""`benches/gpu_closed_loop.py` on CPU, as far as it goes without a GPU: its options are the
example's plus its own, and its NCCL weight pushes send vLLM's and SGLang's routes the requests
their servers read (recorded by a stub server), in order, with the trainer's side of the group
joined beside the right ones. The NCCL transfer itself needs two GPUs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("openai")

from tokentrail.kinds import PauseMode  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benches" / "gpu_closed_loop.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_closed_loop", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Stub:
    """An engine's HTTP side that records every request and answers what the script reads."""

    def __init__(self, fail: str | None = None) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.fail = fail
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                stub.requests.append((method, self.path, body))
                if self.path == stub.fail:
                    self.send_response(500)
                    self.end_headers()
                    return
                reply = {
                    "/get_world_size": {"world_size": 1},
                    "/weight_info": {"weight_version": "3"},
                    "/model_info": {"weight_version": "3"},
                }.get(self.path, {})
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.answer("GET")

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.answer("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def paths(self) -> list[str]:
        return [f"{method} {path}" for method, path, _ in self.requests]

    def body(self, path: str) -> Any:
        return next(body for _, p, body in self.requests if p == path)


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = Stub()
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


class RecordingTransport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def connect(self, address: str, port: int, world_size: int) -> None:
        self.calls.append(("connect", world_size))

    def send(self, tensors: list[tuple[str, Any]]) -> None:
        self.calls.append(("send", [name for name, _ in tensors]))


class Staged:
    """What `stage` reads of the example's trainer: its model."""

    def __init__(self) -> None:
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, bias=False))


NAMES = ["0.weight", "0.bias", "1.weight"]


def test_help_runs_on_cpu_with_the_examples_options() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    for option in ("--steps", "--pause-mode", "--engine", "--trainer-gpu", "--engine-gpu"):
        assert option in out.stdout


def test_arguments_become_the_examples_config(bench: ModuleType) -> None:
    args = bench.parser().parse_args(["--engine", "sglang", "--steps", "3", "--arms", "trained"])
    cfg = bench.closed_loop.config(args)
    assert (args.engine, cfg.steps, cfg.arms) == ("sglang", 3, ("trained",))
    with pytest.raises(SystemExit):
        bench.main(["--trainer-gpu", "1", "--engine-gpu", "1"])


def test_a_vllm_push_is_vllms_weight_transfer_in_order(bench: ModuleType, stub: Stub) -> None:
    transport = RecordingTransport()
    sync = bench.VLLMNccl(stub.url, transport, "cpu")
    sync.stage(Staged(), "trained", 3)
    sync.push("3", PauseMode.KEEP)
    assert stub.paths() == [
        "GET /get_world_size",
        "POST /init_weight_transfer_engine",
        "POST /pause?mode=keep",
        "POST /start_weight_update",
        "POST /update_weights",
        "POST /finish_weight_update",
        "POST /reset_prefix_cache?reset_running_requests=true",
        "POST /resume",
    ]
    init = stub.body("/init_weight_transfer_engine")["init_info"]
    assert (init["rank_offset"], init["world_size"], init["packed"]) == (1, 2, True)
    update = stub.body("/update_weights")["update_info"]
    assert update == {
        "names": NAMES,
        "dtype_names": ["float32"] * 3,
        "shapes": [[3, 4], [3], [2, 3]],
    }
    assert stub.body("/finish_weight_update") == {"weight_version": "3"}
    assert transport.calls == [("connect", 2), ("send", NAMES)]
    assert sync.version() == "3"
    # The group is joined once; the next push only sends.
    sync.push("4", PauseMode.WAIT)
    assert "POST /pause?mode=wait" in stub.paths()
    assert stub.paths().count("POST /init_weight_transfer_engine") == 1


def test_a_failed_vllm_update_still_resumes(bench: ModuleType, stub: Stub) -> None:
    stub.fail = "/update_weights"
    sync = bench.VLLMNccl(stub.url, RecordingTransport(), "cpu")
    sync.stage(Staged(), "trained", 1)
    with pytest.raises(OSError):
        sync.push("1", PauseMode.KEEP)
    assert stub.paths()[-1] == "POST /resume"
    assert "POST /finish_weight_update" not in stub.paths()


def test_an_sglang_push_is_update_weights_from_distributed(bench: ModuleType, stub: Stub) -> None:
    transport = RecordingTransport()
    sync = bench.SGLangNccl(stub.url, transport, "cpu")
    sync.stage(Staged(), "trained", 2)
    sync.push("2", PauseMode.KEEP)
    assert stub.paths() == [
        "POST /init_weights_update_group",
        "POST /update_weights_from_distributed",
    ]
    group = stub.body("/init_weights_update_group")
    assert (group["rank_offset"], group["world_size"], group["backend"]) == (1, 2, "nccl")
    update = stub.body("/update_weights_from_distributed")
    assert update["names"] == NAMES and update["dtypes"] == ["float32"] * 3
    assert update["shapes"] == [[3, 4], [3], [2, 3]]
    assert (update["group_name"], update["weight_version"]) == (group["group_name"], "2")
    assert transport.calls == [("connect", 2), ("send", NAMES)]
    assert sync.version() == "3"
