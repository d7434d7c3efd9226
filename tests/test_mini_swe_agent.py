"""The real mini-swe-agent CLI (the release `support.harness_versions` pins, from PyPI) in its
default configuration, driven headless against the adapter's Chat Completions API.

The scripted model runs a `cd`-prefixed bash command, checks its work and submits: one sample,
every generated token trained, no 4xx, the resumed translation the full one.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from support.mini_swe_agent import MINI_VERSION, SUBMIT, install_mini, run_mini
from support.serve import resume_checks, serving_in_thread
from tokentrail.adapter import Adapter, AdapterConfig
from tokentrail.adapter.http.access_log import AccessLog
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.text.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def mini_exe() -> Path:
    try:
        return install_mini()
    except (OSError, RuntimeError) as exc:
        reason = f"cannot install mini-swe-agent=={MINI_VERSION}: {exc}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        print(f"\n*** SKIPPING the real mini-swe-agent test: {reason} ***", file=sys.stderr)
        pytest.skip(reason)


def _bash(command: str) -> list[dict]:
    return [{"type": "tool_use", "name": "bash", "input": {"command": command}}]


def test_real_mini_swe_agent_default_configuration_is_one_sample(
    mini_exe: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    script = [
        _bash(f"cd {repo} && echo HI > hi.txt"),
        _bash(f"cd {repo} && cat hi.txt"),
        _bash(SUBMIT),
    ]
    tokenizer = load_tokenizer()
    log = tmp_path / "access.log"
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer, script),
        tokenizer=tokenizer,
        config=AdapterConfig(verify_resume=True, access_log=AccessLog(str(log), json=True)),
    )
    with serving_in_thread(adapter) as (url, loop):
        done, out = run_mini(
            mini_exe,
            "Write HI into hi.txt.",
            base_url=url,
            session_id="mini",
            cwd=repo,
            home=tmp_path / "home",
        )
        assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
        trajectory = asyncio.run_coroutine_threadsafe(
            adapter.finish_trajectory("mini", reward=1.0), loop
        ).result(60)
        metrics = adapter.metrics.render()[0].decode()
    assert (repo / "hi.txt").read_text() == "HI\n"
    # mini-swe-agent saw the file's contents from its own check.
    observations = [str(m.get("content")) for m in json.loads(out.read_text())["messages"]]
    assert any('"output": "HI\\n"' in text for text in observations), observations
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(entries) == len(script) and {e["status"] for e in entries} == {200}, entries

    ledger = trajectory.ledger
    assert len(trajectory.samples) == 1 and "fork" not in trajectory.drift_counts
    assert [t.history for t in ledger.turns][1:] == ["splice"] * (len(script) - 1)
    assert ledger.trained_tokens == ledger.generated_tokens > 0
    checks = resume_checks(metrics)
    assert checks["mismatch"] == 0 and checks["same"] >= len(ledger.turns)
