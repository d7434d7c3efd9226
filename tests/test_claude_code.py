"""The real Claude Code CLI (2.1.197, from npm) driven headless against `tokentrail serve`.

The scripted model Reads a file, Edits it (trailing whitespace, no `replace_all`), Writes a `.py`
file with trailing whitespace, runs Bash and ends. Claude Code re-renders the Edit and the Write
when it replays them; the adapter must restore both, and every turn must train.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from support.claude_code import CLAUDE_CODE_VERSION, install_claude_code, run_claude

CALC = "def add(a, b):\n    return a+b   \n\nprint(add(1, 2))\n"


def _script(repo: Path) -> list:
    calc, util = str(repo / "calc.py"), str(repo / "util.py")
    return [
        [
            {"type": "text", "text": "Let me look at calc.py first."},
            {"type": "tool_use", "name": "Read", "input": {"file_path": calc}},
        ],
        [
            {"type": "thinking", "thinking": "The return line needs spaces around +."},
            {
                "type": "tool_use",
                "name": "Edit",
                "input": {
                    "file_path": calc,
                    "old_string": "    return a+b   \n",
                    "new_string": "    # sum of a and b   \n    return a + b\n",
                },
            },
        ],
        [
            {
                "type": "tool_use",
                "name": "Write",
                "input": {"file_path": util, "content": "def mul(a, b):   \n    return a * b  \n"},
            }
        ],
        [
            {
                "type": "tool_use",
                "name": "Bash",
                "input": {"command": "python3 calc.py", "description": "Run calc.py"},
            }
        ],
        [{"type": "text", "text": "Fixed the spacing and added util.py."}],
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tokentrail serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("tokentrail serve did not come up")


@pytest.fixture(scope="module")
def claude_exe() -> Path:
    if shutil.which("npm") is None:
        reason = f"npm is missing: cannot install @anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        print(f"\n*** SKIPPING the real Claude Code test: {reason} ***", file=sys.stderr)
        pytest.skip(reason)
    exe = install_claude_code()
    assert exe is not None
    return exe


def test_real_claude_code_session_trains_every_edit_and_write(
    claude_exe: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    script = tmp_path / "script.json"
    script.write_text(json.dumps(_script(repo)))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokentrail",
            "serve",
            "--port",
            str(port),
            "--engine",
            f"scripted:{script}",
            "--admin-token",
            "cc-admin",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_healthy(url, server)
        run = run_claude(
            claude_exe,
            "Fix the spacing in calc.py and add util.py with mul().",
            base_url=url,
            session_id="cc-session",
            cwd=repo,
            timeout=180,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.result is not None and "util.py" in run.result.get("result", "")

        req = urllib.request.Request(
            f"{url}/tokentrail/sessions/cc-session/finish",
            data=json.dumps({"reward": 1.0}).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": "Bearer cc-admin"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            finished = json.loads(resp.read())
    finally:
        server.terminate()
        server.wait(timeout=30)

    # The edits happened on disk, as Claude Code ran them (right-stripped).
    assert (repo / "calc.py").read_text() == (
        "def add(a, b):\n    # sum of a and b\n    return a + b\n\nprint(add(1, 2))\n"
    )
    assert (repo / "util.py").read_text() == "def mul(a, b):\n    return a * b\n"

    ledger = finished["ledger"]
    assert finished["samples"], "the session produced no sample"
    by_tool = ledger["by_tool"]
    for tool in ("Edit", "Write"):
        assert by_tool[tool]["turns"] == 1
        assert by_tool[tool]["turns_trained"] == 1
        assert by_tool[tool]["tokens_masked"] == 0
    # Claude Code rewrote exactly the Edit (default + strip) and the .py Write (strip).
    assert ledger["restored_echoes"] == 2
    assert ledger["restored_by_tool"] == {"Edit": 1, "Write": 1}
    assert ledger["trained_tokens"] == ledger["generated_tokens"]
