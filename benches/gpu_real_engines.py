"""On a GPU machine: real SGLang and vLLM serve the tiny models, tokentrail records sessions
against them, and the CPU recompute audit checks the samples. Not run by `run_all.py`.

For each engine (`sglang`, `vllm`, whichever is installed) and tiny model (`qwen3`,
`qwen3-moe`): start the server on the tiny model directory (`--dtype float32`; its weights are
the seeded ones saved in the directory, so nothing is downloaded), put the tokentrail adapter in
front of it (`--routed-experts` for the MoE), play a multi-turn chat through the adapter's
OpenAI route at temperature 1, finish the session, and recompute its samples on CPU with
`tokentrail.model.audit`. Prints one table row per (engine, model).

`--load-format dummy` has the engine draw its own random weights instead (what `dummy` means):
nothing is read from the directory but the config, so the logprob columns then measure nothing
and only the plumbing is checked (every position has a routing row of the right shape, the
session trains); the default reads the directory's weights, so the audit applies in full.

`--moe-shape LAYERSxEXPERTSxTOPK` (default 48x128x8, Qwen3-30B-A3B's routing) gives the MoE
model a real MoE's routing shape over the tiny widths, so the routed experts each engine returns
are checked at the size a trainer replays: 48 layers x top-8 ids per token.

    python benches/gpu_real_engines.py [--engines sglang,vllm] [--turns 6] [--load-format auto]
        [--moe-shape 48x128x8]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp

from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.engines import create_engine
from tokentrail.model.audit import recompute_samples
from tokentrail.model.forward import CausalLM, set_threads
from tokentrail.model.tiny import tiny_model
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.manager import TrajectoryManager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(engine: str, path: Path, port: int, load_format: str, moe: bool) -> list[str]:
    if engine == "sglang":
        cmd = [
            sys.executable, "-m", "sglang.launch_server", "--model-path", str(path),
            "--port", str(port), "--dtype", "float32", "--load-format", load_format,
            "--attention-backend", "torch_native", "--disable-cuda-graph",
            "--mem-fraction-static", "0.3", "--skip-server-warmup",
        ]  # fmt: skip
        return [*cmd, "--enable-return-routed-experts"] if moe else cmd
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path),
        "--port", str(port), "--dtype", "float32", "--load-format", load_format,
        "--enforce-eager", "--gpu-memory-utilization", "0.3", "--max-model-len", "32768",
    ]  # fmt: skip
    return [*cmd, "--enable-return-routed-experts"] if moe else cmd


def wait_up(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the engine exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{url} did not come up")


async def session(url: str, turns: int) -> None:
    """A chat of `turns` turns through the adapter, every reply sent back as it came."""
    messages: list[dict] = [{"role": "system", "content": "You are a coding assistant."}]
    headers = {"Authorization": "Bearer gpu-audit"}
    async with aiohttp.ClientSession() as http:
        for k in range(turns):
            messages.append({"role": "user", "content": f"Step {k}: list the files in src/."})
            body = {"model": "tiny", "messages": messages, "max_tokens": 48, "temperature": 1.0}
            async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
                answer = await r.json()
                assert r.status == 200, answer
            messages.append(answer["choices"][0]["message"])


async def record(spec: str, path: Path, turns: int) -> list:
    tokenizer = load_tokenizer(str(path))
    lm = CausalLM(path)
    engine = create_engine(spec, tokenizer)
    adapter = Adapter(
        engine=engine,
        tokenizer=tokenizer,
        manager=TrajectoryManager(routing=lm.routing),
        config=AdapterConfig(routed_experts=lm.routing is not None),
    )
    runner, url = await start_server(adapter)
    try:
        await session(url, turns)
        trajectory = await adapter.finish_trajectory("gpu-audit", reward=1.0)
    finally:
        await runner.cleanup()
        await engine.close()
    return list(trajectory.samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sglang,vllm")
    parser.add_argument("--models", default="qwen3,qwen3-moe")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    parser.add_argument("--moe-shape", default="48x128x8", help="LAYERSxEXPERTSxTOPK")
    args = parser.parse_args()
    layers, experts, top_k = (int(n) for n in args.moe_shape.split("x"))
    moe_fields = {"num_hidden_layers": layers, "num_experts": experts, "num_experts_per_tok": top_k}
    set_threads(4)
    print(f"machine: {platform.node()}, {os.cpu_count()} cores; load format {args.load_format}")
    print(f"MoE routing shape: {layers} layers x top-{top_k} of {experts} experts")
    print("| engine | model | samples | trained | max abs err | mean abs err | routing match |")
    print("|---|---|---|---|---|---|---|")
    for engine in args.engines.split(","):
        if importlib.util.find_spec(engine) is None:
            print(f"| {engine} | - | not installed | | | | |")
            continue
        for name in args.models.split(","):
            path = tiny_model(name, overrides=moe_fields if name == "qwen3-moe" else None)
            moe = CausalLM(path).is_moe
            port = free_port()
            proc = subprocess.Popen(server_command(engine, path, port, args.load_format, moe))
            try:
                wait_up(f"http://127.0.0.1:{port}", proc)
                samples = asyncio.run(record(f"{engine}://127.0.0.1:{port}", path, args.turns))
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            report = recompute_samples(path, samples)
            routing = f"{report.routing_share:.2%}" if report.routed_positions else "-"
            print(
                f"| {engine} | {name} | {len(samples)} | {report.trained} | "
                f"{report.max_error:.2e} | {report.mean_error:.2e} | {routing} |"
            )
            print(report.table(), file=sys.stderr)


if __name__ == "__main__":
    main()
