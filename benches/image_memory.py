"""What images cost `tokentrail serve`'s memory, and whether a finished session gives it back.

`tokentrail serve` runs in a subprocess (the scripted engine, the Qwen3-VL vocabulary, a
journal) and N sessions each send one 20 MB noise PNG of their own (a screenshot's worst case)
over real sockets as Anthropic `/v1/messages` requests, two turns each (the second resends the
image, as harnesses do), and are finished over `/finish`. The server's RSS is read from
`/proc/PID/status`: after a warm-up session with a small image (what serving any image loads
once), its peak (`VmHWM`), and once every session is finished. Each side runs against a
tokentrail tree given as `--python DIR` (its `python/` folder: `--before /work/main/python`
for today's code), this checkout by default; `--extra` adds `serve` flags to this side.

    python benches/image_memory.py [--sessions 10] [--before /work/main/python]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve()
ADMIN = "bench-admin"
MiB = 1024 * 1024


def noise_png(target_bytes: int, seed: int) -> bytes:
    """Noise (PNG cannot compress it), as close to `target_bytes` as a square takes."""
    import numpy as np
    from PIL import Image

    side = int((target_bytes / 3) ** 0.5)
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of `pid` in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def call(port: int, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# The targets: the peak under 1 GB, and after every session finished within 10% of before.
TARGET_PEAK_MB = 1000
TARGET_AFTER = 1.10


@dataclass
class Result:
    before: float
    peak: float
    after: float
    answered: dict[int, int]
    load: str


def run_side(python_dir: str, images: list[bytes], extra: list[str]) -> Result:
    load = os.getloadavg()[0]
    port = free_port()
    env = {**os.environ, "PYTHONPATH": python_dir}
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokentrail", "serve", "--port", str(port),
             "--engine", "scripted", "--tokenizer", "builtin:qwen3-vl",
             "--admin-token", ADMIN, "--journal", str(Path(tmp) / "j.db"),
             "--max-body-bytes", str(64 * MiB), *extra],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            _wait_healthy(port, proc)
            # One session with a small image first: what serving any image loads once (the
            # image libraries) is in `before`, and only what the 20 MB images leave is measured.
            _session(port, "warm-up", _block(noise_png(30_000, seed=2)), {})
            time.sleep(1.5)
            before, _ = rss(proc.pid)
            answered: dict[int, int] = {}
            for n, image in enumerate(images):
                _session(port, f"img-{n}", _block(image), answered)
            time.sleep(2.5)  # the trim after a finish runs at most once a second
            call(port, "GET", "/healthz", b"", {})
            after, peak = rss(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return Result(before, peak, after, answered, f"{load:.1f} -> {os.getloadavg()[0]:.1f}")


def _block(image: bytes) -> dict:
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}
    return {"type": "image", "source": source}


def _session(port: int, sid: str, block: dict, answered: dict[int, int]) -> None:
    """Two turns (the second resends the image) and a finish."""
    messages: list[dict] = [
        {"role": "user", "content": [{"type": "text", "text": "what is this?"}, block]}
    ]
    for _ in range(2):
        body = json.dumps({"model": "m", "max_tokens": 16, "messages": messages})
        headers = {"Content-Type": "application/json", "x-api-key": sid}
        status, raw = call(port, "POST", "/v1/messages", body.encode(), headers)
        answered[status] = answered.get(status, 0) + 1
        if status != 200:
            break
        reply = json.loads(raw)
        messages += [
            {"role": "assistant", "content": reply["content"]},
            {"role": "user", "content": "and now?"},
        ]
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN}"}
    call(port, "POST", f"/tokentrail/sessions/{sid}/finish", b'{"reward": 1}', headers)


def _wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"tokentrail serve exited with {proc.returncode}: {err[-2000:]}")
        try:
            if call(port, "GET", "/healthz", b"", {})[0] == 200:
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError("tokentrail serve did not come up")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--image-mb", type=float, default=20.0)
    parser.add_argument("--before", help="today's tokentrail python/ folder, to compare with")
    parser.add_argument("--python", default=str(HERE.parents[1] / "python"))
    parser.add_argument("--extra", default="", help="more `serve` flags for this side")
    args = parser.parse_args()
    images = [noise_png(int(args.image_mb * 1e6), seed=n) for n in range(args.sessions)]
    sides = [("before", args.before, [])] if args.before else []
    sides.append(("now", args.python, args.extra.split()))
    print(
        f"image memory: {args.sessions} sessions x 2 turns, one {len(images[0]) / 1e6:.1f} MB PNG "
        "of its own each (Anthropic /v1/messages, scripted engine, Qwen3-VL, journal), all finished"
    )
    print(
        f"targets: peak < {TARGET_PEAK_MB} MB, after / before <= {TARGET_AFTER:.2f}; "
        "load average (1 min) at the start and end of each side"
    )
    print(f"{'side':<8}{'RSS before':>12}{'peak':>10}{'after finish':>14}{'after/before':>14}"
          f"{'met':>6}  answered  load")  # fmt: skip
    for name, python_dir, extra in sides:
        r = run_side(python_dir, images, extra)
        met = r.peak < TARGET_PEAK_MB and r.after / r.before <= TARGET_AFTER
        print(
            f"{name:<8}{r.before:>10.0f}MB{r.peak:>8.0f}MB{r.after:>12.0f}MB"
            f"{r.after / r.before:>14.2f}{'yes' if met else 'no':>6}  {r.answered}  {r.load}"
        )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}, shared with other work"
    )


if __name__ == "__main__":
    main()
