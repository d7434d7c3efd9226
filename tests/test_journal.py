"""The durable journal: recovery after SIGKILL, damaged tails, compact prompt storage."""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import anthropic
import numpy as np
import pytest

from tokentrail.sim.harness import (
    CLAUDE_CODE_TOOLS,
    SYSTEM_PROMPT,
    SessionSpec,
    rerender_tool_input,
)
from tokentrail.storage.journal import Journal


def _turn(journal: Journal, sid: str, prompt: list[int], output: list[int], k: int) -> None:
    journal.turn(
        sid,
        translated=[{"role": "user", "content": f"u{k}"}],
        prompt_messages=[{"role": "user", "content": f"u{k}"}],
        response_message={"role": "assistant", "content": f"a{k}"},
        tools=None,
        prompt_ids=prompt,
        output_ids=output,
        logprobs=[-0.5] * len(output),
        finish_reason="stop",
        ill_formed=False,
        metadata={"k": k},
    )


def _grow(journal: Journal, sid: str, turns: int, width: int = 500) -> list[list[int]]:
    prompts, held = [], []
    for k in range(turns):
        prompt = held + list(range(k * 7, k * 7 + width))
        output = [9, 8, 7, k]
        _turn(journal, sid, prompt, output, k)
        prompts.append(prompt)
        held = prompt + output
    return prompts


def test_turns_round_trip_and_are_stored_as_tails(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = Journal(path)
    prompts = _grow(journal, "s", 40)
    journal.close()
    reopened = Journal(path)
    assert reopened.recovery.clean
    from tokentrail.storage.journal import decode_turn

    turns = [decode_turn(reopened, e) for e in reopened.events()]
    assert [t.prompt_ids.tolist() for t in turns] == prompts
    assert turns[3].metadata == {"k": 3} and turns[3].logprobs.dtype == np.float32
    # 40 turns whose prompts total 20 * 41 * 504 ids: stored as tails, the file stays small.
    naive = sum(len(p) for p in prompts) * 4
    (stored,) = sqlite3.connect(path).execute("SELECT sum(length(payload)) FROM events").fetchone()
    assert stored < naive / 10
    assert reopened.recovery.unfinished_sessions() == ["s"]


def test_a_corrupt_event_is_detected_and_the_valid_prefix_kept(tmp_path: Path, caplog) -> None:
    path = tmp_path / "j.db"
    journal = Journal(path)
    _grow(journal, "s", 6)
    journal.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE events SET payload = ? WHERE seq = 5", (b'{"broken": tru',))
    db.commit()
    db.close()
    recovered = Journal(path)
    rec = recovered.recovery
    assert not rec.clean and "event 5: checksum mismatch" in rec.reason
    assert [e.seq for e in rec.events] == [1, 2, 3, 4]
    assert rec.discarded == 2 and rec.damaged_from == 5
    assert rec.moved_to is not None and rec.moved_to.exists()
    assert "not replayed" in caplog.text and str(rec.moved_to) in caplog.text
    _turn(recovered, "s", [1, 2, 3], [4], 99)  # the fresh journal takes new events
    recovered.close()
    again = Journal(path)
    assert again.recovery.clean and len(again.recovery.events) == 5


def test_a_truncated_file_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = Journal(path)
    _grow(journal, "s", 30, width=3000)
    journal._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    journal.close()
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - size // 3)
    rec = Journal(path).recovery
    assert not rec.clean
    assert 0 < len(rec.events) < 30
    assert [e.seq for e in rec.events] == list(range(1, len(rec.events) + 1))
    assert rec.moved_to is not None and rec.moved_to.exists()


# -- SIGKILL mid-session ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ADMIN = "journal-admin"


def _serve(journal: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokentrail",
            "serve",
            "--port",
            str(port),
            "--engine",
            "simulated",
            "--journal",
            str(journal),
            "--admin-token",
            ADMIN,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                return proc, url
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(proc.stderr.read().decode()) from None
            time.sleep(0.2)
    raise TimeoutError("server did not start")


class Conversation:
    """A Claude-Code-like client that can move to another server mid-session."""

    def __init__(self, spec: SessionSpec) -> None:
        self.system = f"{SYSTEM_PROMPT}\n{spec.plan(agent=False).marker()}"
        self.workspace = spec.workspace()
        self.messages: list[dict] = [{"role": "user", "content": "Refactor the modules."}]
        self.done = False

    def step(self, url: str) -> None:
        client = anthropic.Anthropic(base_url=url, api_key="rollout-1", max_retries=0)
        reply = client.messages.create(
            model="m",
            max_tokens=2048,
            system=self.system,
            messages=copy.deepcopy(self.messages),
            tools=CLAUDE_CODE_TOOLS,
        )
        blocks, results = [], []
        for block in reply.content:
            b = block.model_dump(exclude_none=True)
            if b["type"] == "tool_use":
                b["input"] = rerender_tool_input(b["name"], b["input"], CLAUDE_CODE_TOOLS)
                text, _ = self.workspace.run(b["name"], b["input"])
                results.append({"type": "tool_result", "tool_use_id": b["id"], "content": text})
            blocks.append(b)
        self.messages.append({"role": "assistant", "content": blocks})
        if results:
            self.messages.append({"role": "user", "content": results})
        else:
            self.done = True


def _finish(url: str) -> dict:
    req = urllib.request.Request(
        f"{url}/tokentrail/sessions/rollout-1/finish",
        data=b'{"reward": 1.0}',
        method="POST",
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _run(journal: Path, kill_after: int | None) -> dict:
    spec = SessionSpec(seed=11, steps=6, context_tokens=2000)
    convo = Conversation(spec)
    proc, url = _serve(journal)
    try:
        steps = 0
        while not convo.done:
            if kill_after is not None and steps == kill_after:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
                proc, url = _serve(journal)  # same journal: the session is rebuilt
            convo.step(url)
            steps += 1
        return _finish(url)
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
def test_sigkill_mid_session_loses_nothing(tmp_path: Path) -> None:
    uninterrupted = _run(tmp_path / "a.db", kill_after=None)
    interrupted = _run(tmp_path / "b.db", kill_after=3)
    assert len(uninterrupted["ledger"]["turns"]) == 7
    assert interrupted["samples"] == uninterrupted["samples"]
    assert interrupted["ledger"] == uninterrupted["ledger"]
