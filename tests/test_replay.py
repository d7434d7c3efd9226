"""`tokentrail replay` and `tokentrail audit` on journals recorded by a real adapter."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.cli import main as cli_main
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.kinds import History, Restore
from tokentrail.sim.harness import HarnessSim, Workspace
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.read import read_journal
from tokentrail.storage.replay import Settings, as_recorded, replay
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.manager import TrajectoryManager


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def record(tokenizer, path: Path, *, restore: str, policy: str, sessions: int = 2) -> list[dict]:
    """Serve the scripted coding session `sessions` times with a journal; return /finish answers."""

    async def go() -> list[dict]:
        adapter = Adapter(
            engine=ScriptedEngine(tokenizer),
            tokenizer=tokenizer,
            manager=TrajectoryManager(rewrite_policy=policy),
            config=AdapterConfig(restore=Restore(restore), admin_token="replay-admin"),
            journal=Journal(path),
        )
        runner, url = await start_server(adapter)
        answers = []
        try:
            async with aiohttp.ClientSession() as http:
                for k in range(sessions):
                    await HarnessSim(url, f"job-{k}", workspace=Workspace()).run("Fix it", http)
                    finish = f"{url}/tokentrail/sessions/job-{k}/finish"
                    admin = {"Authorization": "Bearer replay-admin"}
                    async with http.post(finish, json={"reward": 1.0}, headers=admin) as resp:
                        answers.append(await resp.json())
        finally:
            await runner.cleanup()
            adapter.journal.close()
        return answers

    return asyncio.run(go())


def test_as_recorded_reproduces_what_the_adapter_answered(tokenizer, tmp_path: Path) -> None:
    answers = record(tokenizer, tmp_path / "j.db", restore="on", policy="fork")
    replayed = as_recorded(read_journal(tmp_path / "j.db"))
    assert [
        {"samples": [s.to_dict() for s in t.samples], "ledger": t.ledger.to_dict(), "lost": t.lost}
        for t in replayed.values()
    ] == answers


def test_replay_under_the_same_settings_gives_the_same_samples(tokenizer, tmp_path: Path) -> None:
    record(tokenizer, tmp_path / "j.db", restore="on", policy="fork")
    contents = read_journal(tmp_path / "j.db")
    recorded = as_recorded(contents)
    again = replay(contents, Settings.recorded(contents.meta), tokenizer)
    for sid in recorded:
        assert [s.to_dict() for s in again[sid].samples] == [
            s.to_dict() for s in recorded[sid].samples
        ]


def test_replay_with_restore_recovers_the_lost_edit_turns(tokenizer, tmp_path: Path, capsys):
    record(tokenizer, tmp_path / "j.db", restore="off", policy="merge")
    contents = read_journal(tmp_path / "j.db")
    before = as_recorded(contents)
    after = replay(
        contents,
        Settings(restore=Restore.ON, history=History.SPLICE, rewrite_policy="fork"),
        tokenizer,
    )
    for sid in before:
        assert before[sid].ledger.by_tool["Edit"]["turns_trained"] == 0
        assert after[sid].ledger.by_tool["Edit"]["turns_trained"] == 1
        assert after[sid].ledger.trained_tokens == after[sid].ledger.generated_tokens
    out = tmp_path / "replayed.jsonl"
    code = cli_main(
        [
            "replay",
            str(tmp_path / "j.db"),
            "--restore",
            "on",
            "--rewrite-policy",
            "fork",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    edit = next(line for line in text.splitlines() if line.startswith("Edit"))
    assert "100% -> 0%" in edit
    assert len(out.read_text().splitlines()) == 2


def test_audit_gates_on_the_masked_fraction(tokenizer, tmp_path: Path, capsys) -> None:
    record(tokenizer, tmp_path / "lossy.db", restore="off", policy="merge", sessions=1)
    answers = record(tokenizer, tmp_path / "clean.db", restore="on", policy="fork", sessions=1)
    assert cli_main(["audit", str(tmp_path / "lossy.db")]) == 1
    assert "merged_rewrite" in capsys.readouterr().out
    assert cli_main(["audit", str(tmp_path / "lossy.db"), "--max-masked", "0.5"]) == 0
    assert cli_main(["audit", str(tmp_path / "clean.db")]) == 0
    finished = tmp_path / "finished.jsonl"
    finished.write_text("".join(json.dumps(a) + "\n" for a in answers))
    assert cli_main(["audit", str(finished)]) == 0
    assert "masked fraction 0.0000" in capsys.readouterr().out
    # An error answer saved in place of a finish answer (`curl -o`, a 404) is no clean batch.
    error = {"error": {"message": "unknown session 'job-9'", "type": "not_found_error"}}
    finished.write_text(json.dumps(answers[0]) + "\n" + json.dumps(error) + "\n")
    assert cli_main(["audit", str(finished)]) == 1
    assert "line 2: no ledger: unknown session 'job-9'" in capsys.readouterr().err


def test_a_lossy_session_logs_one_warning_naming_tools_and_reasons(
    tokenizer, tmp_path: Path, caplog
) -> None:
    with caplog.at_level("WARNING", logger="tokentrail.adapter.session.sessions"):
        record(tokenizer, tmp_path / "j.db", restore="off", policy="merge", sessions=1)
    lines = [
        r.getMessage() for r in caplog.records if r.name == "tokentrail.adapter.session.sessions"
    ]
    assert len(lines) == 1
    assert "job-0" in lines[0] and "Edit (merged_rewrite=1)" in lines[0]
