"""A Claude-Code-like client that resends a request, byte for byte, until it gets a reply.

Like hermes-agent and Qwen Code after a 5xx or a dropped connection: the same body again, after
the caller's `recover` (which restarts the server when it has died). A streamed reply counts
only when it ends with `message_stop`; anything short of a whole reply is a failure.

Also the helpers that start and stop `tokentrail serve` subprocesses, for the kill sweep in
`benches/kill_sweep.py` and its small version in `tests/test_exactly_once.py`.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokentrail.sim.harness import (
    CLAUDE_CODE_TOOLS,
    SYSTEM_PROMPT,
    SessionSpec,
    rerender_tool_input,
)

CRASHING = Path(__file__).with_name("crashing_server.py")
ADMIN = "kill-sweep-admin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def serve(
    journal: Path, port: int, *, crash: tuple[str, int] | None = None, engine: str = "simulated"
) -> subprocess.Popen[bytes]:
    """`tokentrail serve --journal` on `port` (crashing at `crash`, if given), once healthy."""
    args = ["serve", "--port", str(port), "--engine", engine, "--journal", str(journal)]
    args += ["--admin-token", ADMIN]
    if crash is None:
        cmd = [sys.executable, "-m", "tokentrail", *args]
    else:
        cmd = [sys.executable, str(CRASHING), crash[0], str(crash[1]), "--", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(proc.stderr.read().decode() if proc.stderr else "") from None
            time.sleep(0.05)
    raise TimeoutError("server did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    if proc.stderr is not None:
        proc.stderr.close()


class Failed(Exception):
    """No whole reply came back."""


def _post(url: str, body: bytes, sid: str) -> bytes:
    request = urllib.request.Request(
        f"{url}/v1/messages",
        data=body,
        headers={"Content-Type": "application/json", "x-api-key": sid},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return bytes(resp.read())
    except urllib.error.HTTPError as exc:
        raise Failed(f"HTTP {exc.code}") from None
    except (OSError, http.client.HTTPException) as exc:
        raise Failed(str(exc)) from None


def _blocks(raw: bytes, stream: bool) -> list[dict[str, Any]]:
    """The reply's content blocks; a stream must be whole."""
    if not stream:
        try:
            return list(json.loads(raw)["content"])
        except (ValueError, KeyError) as exc:
            raise Failed(f"not a reply: {exc}") from None
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    done = False
    for line in raw.decode(errors="replace").splitlines():
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        kind = event["type"]
        if kind == "content_block_start":
            blocks.append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            delta, block = event["delta"], blocks[event["index"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif kind == "message_stop":
            done = True
    if not done:
        raise Failed("the stream ended early")
    for index, text in partial.items():
        blocks[index]["input"] = json.loads(text)
    return blocks


class RetryingClient:
    """Plays one simulated coding session; every request is resent until it gets a reply."""

    def __init__(self, spec: SessionSpec, sid: str, *, stream: bool) -> None:
        self.sid = sid
        self.stream = stream
        self.system = f"{SYSTEM_PROMPT}\n{spec.plan(agent=False).marker()}"
        self.workspace = spec.workspace()
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "Refactor it all."}]
        self.done = False
        self.requests = 0
        self.retries = 0

    def body(self) -> bytes:
        return json.dumps(
            {
                "model": "m",
                "max_tokens": 2048,
                "system": self.system,
                "messages": copy.deepcopy(self.messages),
                "tools": CLAUDE_CODE_TOOLS,
                "stream": self.stream,
            }
        ).encode()

    def step(self, url: Callable[[], str], recover: Callable[[], None], attempts: int = 6) -> None:
        body = self.body()
        for attempt in range(attempts):
            self.requests += 1
            try:
                blocks = _blocks(_post(url(), body, self.sid), self.stream)
                break
            except Failed:
                if attempt == attempts - 1:
                    raise
                self.retries += 1
                recover()
        echoed, results = [], []
        for block in blocks:
            b = {k: v for k, v in block.items() if v is not None}
            if b["type"] == "tool_use":
                b["input"] = rerender_tool_input(b["name"], b["input"], CLAUDE_CODE_TOOLS)
                text, _ = self.workspace.run(b["name"], b["input"])
                results.append({"type": "tool_result", "tool_use_id": b["id"], "content": text})
            echoed.append(b)
        self.messages.append({"role": "assistant", "content": echoed})
        if results:
            self.messages.append({"role": "user", "content": results})
        else:
            self.done = True


def finish(url: str, sid: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/tokentrail/sessions/{sid}/finish",
        data=b'{"reward": 1.0}',
        method="POST",
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        return dict(json.loads(resp.read()))


def run_session(
    workdir: Path,
    spec: SessionSpec,
    *,
    stream: bool,
    crash: tuple[str, int] | None = None,
) -> tuple[dict[str, Any], RetryingClient, bool]:
    """One session against a journaled server that may crash at `crash`; a crashed server is
    started again on the same journal. Returns the /finish answer, the client, and whether the
    server crashed."""
    workdir.mkdir(parents=True, exist_ok=True)
    journal = workdir / "run.db"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    holder = {"proc": serve(journal, port, crash=crash)}
    crashed = False

    def recover() -> None:
        nonlocal crashed
        proc = holder["proc"]
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return  # alive: a plain retry
        crashed = True
        stop(proc)
        holder["proc"] = serve(journal, port)

    client = RetryingClient(spec, "rollout", stream=stream)
    try:
        while not client.done:
            client.step(lambda: url, recover)
        try:
            answer = finish(url, "rollout")
        except OSError:  # killed right after the last reply went out
            recover()
            answer = finish(url, "rollout")
        return answer, client, crashed
    finally:
        stop(holder["proc"])


def compare(clean: dict[str, Any], other: dict[str, Any]) -> dict[str, int]:
    """Turns duplicated or lost against an uninterrupted run, and whether samples agree."""
    a, b = clean["ledger"], other["ledger"]
    turns_a, turns_b = len(a["turns"]), len(b["turns"])
    strip = [{k: v for k, v in t.items() if k != "retries"} for t in a["turns"]]
    same_turns = strip == [{k: v for k, v in t.items() if k != "retries"} for t in b["turns"]]
    return {
        "duplicated": max(0, turns_b - turns_a),
        "lost": max(0, turns_a - turns_b),
        "identical": int(clean["samples"] == other["samples"] and same_turns),
        "answered": int(b.get("retries", 0)),
    }
