"""On a machine with two GPUs: `examples/closed_loop.py`'s loop, unchanged, with the weights going
into the engine over NCCL instead of through a checkpoint directory. Not run by `run_all.py`, and
not run yet: no GPU was available where it was written.

The harness, tokentrail serve, the GRPO trainer, the arms, the rewards and the output are the
example's (imported from it); only the engine and the `WeightSync` differ:

- `--engine vllm`: vLLM (0.32) started with `--weight-transfer-config '{"backend":"nccl"}'` and
  `VLLM_SERVER_DEV_MODE=1`. Once: `POST /init_weight_transfer_engine` while the trainer joins
  the group as rank 0. Each push: `/pause?mode=...`, `/start_weight_update`, `/update_weights`
  (the names, dtypes and shapes) while the trainer broadcasts the tensors (vLLM's packed
  producer, as TRL's `AsyncGRPOTrainer` sends them), `/finish_weight_update` with the version,
  `/reset_prefix_cache?reset_running_requests=true`, `/resume`. tokentrail samples on the
  tokens route (`vllm-tokens://`), whose answers name each token's version.
- `--engine sglang`: SGLang started with `--enable-metrics`. Once: `POST
  /init_weights_update_group` while the trainer joins the group; each push:
  `/update_weights_from_distributed` (names, dtypes, shapes, the version) while the trainer
  broadcasts each tensor. SGLang holds new batches while it loads; `--pause-mode` is not used.

The trainer runs on `--trainer-gpu`, the engine on `--engine-gpu`: NCCL refuses two ranks of one
group on the same device, so the two must differ.

    python benches/gpu_closed_loop.py --engine vllm --steps 10 [--trainer-gpu 0 --engine-gpu 1]
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))

import closed_loop  # noqa: E402
from closed_loop import VLLM_GENERATED, StepRow, Trainer  # noqa: E402

from tokentrail.engines.vllm_process import VLLMServer, free_port  # noqa: E402
from tokentrail.kinds import PauseMode  # noqa: E402
from tokentrail.model.tiny import tiny_model  # noqa: E402

GROUP = "tokentrail-closed-loop"
SGLANG_GENERATED = "sglang:generation_tokens_total"
ENGINES = ("vllm", "sglang")

Tensors = list[tuple[str, torch.Tensor]]


class Transport(Protocol):
    """The trainer's side of the NCCL group: rank 0, the engine's workers after it."""

    def connect(self, address: str, port: int, world_size: int) -> None: ...

    def send(self, tensors: Tensors) -> None: ...


class VLLMTransport:
    """vLLM's own trainer side (`vllm.distributed.weight_transfer`), packed, as TRL sends."""

    def __init__(self) -> None:
        self.group: Any = None

    def connect(self, address: str, port: int, world_size: int) -> None:
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        info = {"master_address": address, "master_port": port, "world_size": world_size}
        self.group = trainer_init(info)

    def send(self, tensors: Tensors) -> None:
        from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

        packed_nccl_broadcast_producer(
            iterator=iter(tensors), group=self.group, src=0, post_iter_func=lambda item: item[1]
        )


class SGLangTransport:
    """A torch process group beside the default one (SGLang's helper), one broadcast a tensor
    in the order of the names SGLang was sent."""

    def __init__(self) -> None:
        self.group: Any = None

    def connect(self, address: str, port: int, world_size: int) -> None:
        from sglang.srt.utils import init_custom_process_group

        self.group = init_custom_process_group(
            backend="nccl", init_method=f"tcp://{address}:{port}", world_size=world_size,
            rank=0, group_name=GROUP,
        )  # fmt: skip

    def send(self, tensors: Tensors) -> None:
        for _, tensor in tensors:
            torch.distributed.broadcast(tensor, src=0, group=self.group)


def http(url: str, method: str, path: str, body: Any = None, timeout: float = 600.0) -> Any:
    data = json.dumps({} if body is None else body).encode() if method == "POST" else None
    request = urllib.request.Request(
        url + path, data=data, headers={"Content-Type": "application/json"}, method=method
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        raw = resp.read()
    return json.loads(raw) if raw.strip() else None


def together(request: Callable[[], Any], transport: Callable[[], None]) -> None:
    """The engine's HTTP call and the trainer's NCCL side at once: each blocks until the
    other joins. The NCCL side runs on a thread, so a failed request surfaces as its error."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            transport()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    request()
    thread.join()
    if errors:
        raise errors[0]


def manifest(tensors: Tensors) -> tuple[list[str], list[str], list[list[int]]]:
    return (
        [name for name, _ in tensors],
        [str(t.dtype).removeprefix("torch.") for _, t in tensors],
        [list(t.shape) for _, t in tensors],
    )


class NcclWeights(abc.ABC):
    """`closed_loop.WeightSync` over NCCL: the trainer's live parameters, no file."""

    generated_metric = VLLM_GENERATED

    def __init__(self, url: str, transport: Transport, device: str) -> None:
        self.url = url
        self.transport = transport
        self.device = device
        self.model: torch.nn.Module | None = None
        self.connected = False

    def start(self, model_dir: Path) -> None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self._send(model.to(self.device), "0", PauseMode.WAIT)

    def stage(self, trainer: Trainer, arm: str, step: int) -> None:
        self.model = trainer.model

    def push(self, version: str, mode: PauseMode) -> None:
        assert self.model is not None, "stage() comes before push()"
        self._send(self.model, version, mode)

    def _tensors(self, model: torch.nn.Module) -> Tensors:
        return [(name, p.detach()) for name, p in model.named_parameters()]

    @abc.abstractmethod
    def _send(self, model: torch.nn.Module, version: str, mode: PauseMode) -> None: ...

    @abc.abstractmethod
    def version(self) -> str: ...


class VLLMNccl(NcclWeights):
    def _connect(self) -> None:
        engine_ranks = int(http(self.url, "GET", "/get_world_size")["world_size"])
        port = free_port()
        info = {
            "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
            "world_size": engine_ranks + 1, "packed": True,
        }  # fmt: skip
        together(
            lambda: http(self.url, "POST", "/init_weight_transfer_engine", {"init_info": info}),
            lambda: self.transport.connect("127.0.0.1", port, engine_ranks + 1),
        )
        self.connected = True

    def _send(self, model: torch.nn.Module, version: str, mode: PauseMode) -> None:
        if not self.connected:
            self._connect()
        tensors = self._tensors(model)
        names, dtypes, shapes = manifest(tensors)
        update = {"names": names, "dtype_names": dtypes, "shapes": shapes}
        http(self.url, "POST", "/pause?" + urllib.parse.urlencode({"mode": str(mode)}))
        try:
            http(self.url, "POST", "/start_weight_update", {"is_checkpoint_format": True})
            together(
                lambda: http(self.url, "POST", "/update_weights", {"update_info": update}),
                lambda: self.transport.send(tensors),
            )
            http(self.url, "POST", "/finish_weight_update", {"weight_version": version})
            # As on CPU: no KV the old weights computed is reused (see VLLMWeights.push).
            http(self.url, "POST", "/reset_prefix_cache?reset_running_requests=true")
        finally:
            http(self.url, "POST", "/resume")

    def version(self) -> str:
        return str(http(self.url, "GET", "/weight_info")["weight_version"])


class SGLangNccl(NcclWeights):
    generated_metric = SGLANG_GENERATED

    def _connect(self) -> None:
        port = free_port()
        body = {
            "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
            "world_size": 2, "group_name": GROUP, "backend": "nccl",
        }  # fmt: skip
        together(
            lambda: http(self.url, "POST", "/init_weights_update_group", body),
            lambda: self.transport.connect("127.0.0.1", port, 2),
        )
        self.connected = True

    def _send(self, model: torch.nn.Module, version: str, mode: PauseMode) -> None:
        if not self.connected:
            self._connect()
        tensors = self._tensors(model)
        names, dtypes, shapes = manifest(tensors)
        body = {
            "names": names, "dtypes": dtypes, "shapes": shapes, "group_name": GROUP,
            "flush_cache": True, "weight_version": version,
        }  # fmt: skip
        together(
            lambda: http(self.url, "POST", "/update_weights_from_distributed", body),
            lambda: self.transport.send(tensors),
        )

    def version(self) -> str:
        return str(http(self.url, "GET", "/model_info")["weight_version"])


@contextlib.contextmanager
def visible(gpu: int) -> Iterator[None]:
    """The engine's process sees one GPU, `gpu`."""
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


@contextlib.contextmanager
def sglang_server(model_dir: Path, gpu: int) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with visible(gpu):
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir),
             "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
             "--random-seed", "0", "--enable-metrics", "--mem-fraction-static", "0.3"],
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 900
        while True:
            try:
                http(url, "GET", "/health_generate", timeout=10)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("sglang did not come up") from None
                time.sleep(2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@contextlib.contextmanager
def engine(name: str, model_dir: Path, gpu: int) -> Iterator[tuple[str, str]]:
    """The engine serving `model_dir` on `gpu`: (its URL, tokentrail's engine spec for it)."""
    if name == "sglang":
        with sglang_server(model_dir, gpu) as url:
            yield url, "sglang://" + url.removeprefix("http://")
        return
    with visible(gpu):
        server = VLLMServer.start(
            Path(sys.executable), model_dir, max_model_len=4096,
            extra_args=["--weight-transfer-config", '{"backend":"nccl"}',
                        "--gpu-memory-utilization", "0.3"],
        )  # fmt: skip
    try:
        yield server.url, "vllm-tokens://" + server.url.removeprefix("http://")
    finally:
        server.stop()


def parser() -> argparse.ArgumentParser:
    out = closed_loop.arguments(__doc__.split("\n\n")[0])
    out.add_argument("--engine", choices=ENGINES, default="vllm")
    out.add_argument("--trainer-gpu", type=int, default=0)
    out.add_argument("--engine-gpu", type=int, default=1)
    return out


def sync_for(name: str, url: str, device: str) -> NcclWeights:
    if name == "sglang":
        return SGLangNccl(url, SGLangTransport(), device)
    return VLLMNccl(url, VLLMTransport(), device)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.trainer_gpu == args.engine_gpu:
        sys.exit("--trainer-gpu and --engine-gpu must differ: NCCL refuses one device twice")
    if not torch.cuda.is_available():
        sys.exit("no GPU: this script needs two (see its docstring); the CPU loop is examples/")
    cfg = closed_loop.config(args)
    device = f"cuda:{args.trainer_gpu}"
    torch.cuda.set_device(device)
    model_dir = tiny_model(cfg.model, overrides={"tie_word_embeddings": False})
    started = time.perf_counter()
    rows: list[StepRow] = []
    with engine(args.engine, model_dir, args.engine_gpu) as (engine_url, spec):
        with closed_loop.tokentrail_serve(spec, model_dir) as url:
            print(f"{args.engine} at {engine_url}; tiny {cfg.model}", flush=True)
            print(closed_loop.HEADER, flush=True)
            sync = sync_for(args.engine, engine_url, device)
            for arm in cfg.arms:
                rows += asyncio.run(closed_loop.run_arm(arm, cfg, sync, url, model_dir, device))
    closed_loop.report(rows, cfg, started, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
