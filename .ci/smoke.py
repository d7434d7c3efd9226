"""A smoke test of an installed tokentrail, run from outside the source tree: the package and
its extension come from the environment given, `doctor` passes on the built-in defaults, and
`serve` answers one Anthropic turn over a socket and hands its training sample to a finish.

    python .ci/smoke.py VENV
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import tokentrail
from tokentrail import _core


def check(ok: bool, message: str) -> None:
    if not ok:
        print(f"smoke: {message}", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    venv = Path(sys.argv[1]).resolve()
    for module in (tokentrail, _core):
        check(
            Path(module.__file__).resolve().is_relative_to(venv), f"{module.__file__} not in {venv}"
        )
    check(Path(_core.__file__).name == "_core.abi3.so", f"not the abi3 extension: {_core.__file__}")
    with tempfile.TemporaryDirectory() as tmp:
        doctor = subprocess.run(
            ["tokentrail", "doctor", "--admin-token", "t", "--journal", f"{tmp}/j.db"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        check(doctor.returncode == 0, f"doctor failed:\n{doctor.stdout}{doctor.stderr}")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen(
            ["tokentrail", "serve", "--port", str(port), "--admin-token", "t",
             "--journal", f"{tmp}/serve.db"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            samples = one_turn(f"http://127.0.0.1:{port}", server)
        finally:
            server.terminate()
            server.wait(timeout=30)
    check(len(samples) == 1 and sum(samples[0]["loss_mask"]) > 0, f"no trained sample: {samples}")
    print(
        f"smoke: tokentrail {tokentrail.__version__} from {venv}: doctor passes; serve answered a "
        f"turn and finished a sample of {len(samples[0]['tokens'])} tokens"
    )


def one_turn(url: str, server: subprocess.Popen[bytes]) -> list[dict]:
    deadline = time.monotonic() + 120
    while True:
        if server.poll() is not None:
            output = server.stdout.read().decode(errors="replace") if server.stdout else ""
            check(False, f"serve exited with {server.returncode}:\n{output}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                break
        except OSError:
            check(time.monotonic() < deadline, "serve did not come up")
            time.sleep(0.2)
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    post(url + "/v1/messages", body, {"x-api-key": "smoke"})
    finish = post(url + "/tokentrail/sessions/smoke/finish", {"reward": 1.0},
                  {"Authorization": "Bearer t"})  # fmt: skip
    return finish["samples"]


def post(url: str, body: dict, headers: dict[str, str]) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


if __name__ == "__main__":
    main()
