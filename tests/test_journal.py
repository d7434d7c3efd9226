"""The durable journal: turns stored as what is new, one writer, damage reported per session,
schema-1 journals still read."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tokentrail.adapter.config import SessionSettings
from tokentrail.core.routing import ReplayRows, WeightSpan
from tokentrail.errors import JournalError
from tokentrail.kinds import Fallback, History, JournalEvent, ReplayGap, Retry
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.read import check_journal, read_journal
from tokentrail.storage.journal.record import JournaledTurn

TOOLS = [
    {
        "type": "function",
        "function": {"name": "Read", "description": "x" * 2000, "parameters": {"type": "object"}},
    }
]


def _turn(journal: Journal, sid: str, messages: list[dict], prompt, output, k: int) -> int:
    return journal.turn(
        JournaledTurn(
            sid,
            translated=messages,
            response_message={"role": "assistant", "content": f"a{k}"},
            tools=TOOLS,
            prompt_ids=prompt,
            output_ids=output,
            logprobs=[-0.5] * len(output),
            finish_reason="stop",
            ill_formed=False,
            metadata={"k": k},
            answer={"reply": {"k": k}},
        )
    )


def _grow(journal: Journal, sid: str, turns: int, width: int = 500, text: int = 4000) -> list:
    """A session whose every turn adds a tool result and extends the previous prompt."""
    made, held, messages = [], [], [{"role": "system", "content": "s" * text}]
    rng = np.random.default_rng([ord(c) for c in sid])
    for k in range(turns):
        noise = rng.bytes(text // 2).hex()  # as hard to deflate as a real file
        messages = [*messages, {"role": "tool", "content": f"<{sid}{k}>" + noise}]
        prompt = held + rng.integers(0, 150_000, width).tolist()
        output = [9, 8, 7, k]
        _turn(journal, sid, list(messages), prompt, output, k)
        made.append((list(messages), prompt, output))
        messages = [*messages, {"role": "assistant", "content": f"a{k}"}]
        held = prompt + output
    return made


def _crashed_copy(journal: Journal, where: Path) -> Path:
    """The files a crash would leave now: the database, its WAL and the receipts."""
    where.mkdir(parents=True, exist_ok=True)
    target = where / journal.path.name
    for suffix in ("", "-wal", "-receipts"):
        src = Path(f"{journal.path}{suffix}")
        if src.exists():
            shutil.copyfile(src, f"{target}{suffix}")
    return target


def _wal_commit_ends(wal: Path) -> list[int]:
    """The byte offset just past each commit frame of a WAL file (its header's page size)."""
    data = wal.read_bytes()
    page = int.from_bytes(data[8:12], "big")
    ends, at = [], 32
    while at + 24 + page <= len(data):
        if int.from_bytes(data[at + 4 : at + 8], "big"):
            ends.append(at + 24 + page)
        at += 24 + page
    return ends


def _flip(path: Path, marker: bytes, offset: int = 16, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    at = data.index(marker) + offset
    data[at : at + n] = bytes(b ^ 0xFF for b in data[at : at + n])
    path.write_bytes(bytes(data))


def _live(journal: Journal) -> dict[str, list]:
    out: dict[str, list] = {}
    for event in journal.live_events():
        if event.kind is JournalEvent.TURN:
            out.setdefault(event.sid, []).append(event.turn)
    return out


def test_turns_round_trip_and_store_only_what_is_new(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = Journal(path)
    made = _grow(journal, "s", 30)
    journal.close()
    reopened = Journal(path)
    turns = _live(reopened)["s"]
    reopened.close()
    assert [t.prompt_ids.tolist() for t in turns] == [p for _, p, _ in made]
    assert [t.translated for t in turns] == [m for m, _, _ in made]
    assert all(t.tools == TOOLS for t in turns)
    assert turns[3].metadata == {"k": 3} and turns[3].logprobs.dtype == np.float32
    assert turns[3].answer == {"reply": {"k": 3}}
    # Each turn stores its new tool result and prompt tail, not the whole list or prompt.
    db = sqlite3.connect(path)
    rows = db.execute("SELECT length(payload) + length(ids) FROM events WHERE kind = 'turn'")
    sizes = [n for (n,) in rows]
    new_bytes = 4000 + 500 * 4 + 4 * 8
    assert max(sizes[1:]) < new_bytes + 1500
    assert db.execute("SELECT count(*) FROM blobs").fetchone() == (1,)


def test_a_journaled_turn_reads_back_as_the_record_it_was(tmp_path: Path) -> None:
    """Every field of the record the writer takes comes back from the reader: ids as
    arrays, the answer, the retry flag, the replay rows and the weight versions."""
    experts = np.array([[[1, 7]], [[3, 0]], [[5, 2]]], dtype=np.int64)
    made = JournaledTurn(
        "s",
        translated=[{"role": "user", "content": "hi"}],
        response_message={"role": "assistant", "content": "yo"},
        tools=TOOLS,
        prompt_ids=[11, 12, 13],
        output_ids=[21, 22],
        logprobs=[-0.25, -1.5],
        finish_reason="length",
        ill_formed=True,
        metadata={"protocol": "anthropic"},
        history=History.SPLICE,
        fallback=Fallback.NO_BOUNDARY,
        answer={"reply": {"text": "yo"}},
        supersedes=True,
        routed_experts=ReplayRows(experts, 1),
        indexer_topk=ReplayRows.missing(ReplayGap.SHAPE_MISMATCH),
        weight_versions=(WeightSpan("v7", 0, 1), WeightSpan("v8", 1, 2)),
        seq=99,  # the journal numbers its events itself
    )
    journal = Journal(tmp_path / "j.db")
    journal.session_opened("s", {})
    assert journal.turn(made) == 2
    journal.close()
    (back,) = read_journal(tmp_path / "j.db").served_turns()
    assert back.seq == 2 and back.sid == "s"
    assert back.prompt_ids.tolist() == [11, 12, 13] and back.output_ids.tolist() == [21, 22]
    assert back.logprobs.dtype == np.float32 and back.logprobs.tolist() == [-0.25, -1.5]
    assert back.routed_experts.start == 1
    assert np.array_equal(back.routed_experts.rows, experts)
    same = ("prompt_ids", "output_ids", "logprobs", "routed_experts", "seq")
    for name in {f.name for f in dataclasses.fields(JournaledTurn)} - set(same):
        assert getattr(back, name) == getattr(made, name), name


def test_branches_are_stored_against_their_own_base(tmp_path: Path) -> None:
    """A sub-agent's turns in between do not make the main conversation store itself again."""
    path = tmp_path / "j.db"
    journal = Journal(path)
    main = list(range(20_000))
    _turn(journal, "s", [{"role": "user", "content": "main"}], main, [1, 2], 0)
    sub = list(range(50_000, 50_300))
    _turn(journal, "s", [{"role": "user", "content": "sub"}], sub, [3], 1)
    _turn(journal, "s", [{"role": "user", "content": "sub"}], sub + [3, 4, 5], [6], 2)
    back = [{"role": "user", "content": "main"}, {"role": "assistant", "content": "a0"}]
    _turn(journal, "s", back, main + [1, 2, 7, 8], [9], 3)
    journal.close()
    (ids,) = sqlite3.connect(path).execute("SELECT length(ids) FROM events WHERE sess_seq = 4")
    assert ids[0] < 100  # the tail past the main branch, not 20,000 ids again
    again = Journal(path)
    turns = _live(again)["s"]
    again.close()
    assert turns[3].prompt_ids.tolist() == main + [1, 2, 7, 8]
    assert turns[3].translated == back


def test_a_second_writer_fails_fast_naming_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = Journal(path)
    with pytest.raises(JournalError, match=f"in use by process {os.getpid()}"):
        Journal(path)
    journal.close()
    Journal(path).close()  # released on close


@pytest.mark.skipif(os.name != "posix", reason="flock and SIGKILL")
def test_the_lock_of_a_killed_process_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from tokentrail.storage.journal import Journal; "
            f"j = Journal({str(path)!r}); print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"ready"
        with pytest.raises(JournalError, match=f"in use by process {holder.pid}"):
            Journal(path)
    finally:
        holder.kill()
        holder.wait(timeout=10)
    Journal(path).close()


def test_a_lost_wal_tail_is_reported_per_session_and_the_rest_kept(tmp_path: Path) -> None:
    (tmp_path / "live").mkdir()
    journal = Journal(tmp_path / "live" / "j.db")
    _grow(journal, "a", 3)
    _grow(journal, "b", 2, text=10)
    crashed = _crashed_copy(journal, tmp_path / "crash")
    journal.close()
    wal = Path(f"{crashed}-wal")
    # Cut the WAL after the commit of a's second turn: a's third turn and all of b are lost.
    os.truncate(wal, _wal_commit_ends(wal)[-4] + 100)
    reopened = Journal(crashed)
    damaged = {d.sid: (d.first, d.lost) for d in reopened.recovery.damaged}
    assert damaged == {"a": (3, 1), "b": (1, 2)}
    assert all("WAL tail" in d.reason for d in reopened.recovery.damaged)
    turns = _live(reopened)
    reopened.close()
    assert len(turns["a"]) == 2 and "b" not in turns
    # Reported once: the loss is marked in the sessions, the next open is clean.
    again = Journal(crashed)
    assert again.recovery.clean and again.recovery.live == ["a", "b"]
    again.close()
    report = check_journal(crashed)
    assert report.ok and "1 events lost earlier" in report.sessions["a"].status
    # The same cut, reported by `journal check` before any server opens the file.
    journal = Journal(tmp_path / "y.db")
    _grow(journal, "a", 3)
    cut = _crashed_copy(journal, tmp_path / "cut")
    journal.close()
    os.truncate(Path(f"{cut}-wal"), _wal_commit_ends(Path(f"{cut}-wal"))[-2])
    assert check_journal(cut).sessions["a"].first_bad == 3


def test_a_damaged_event_costs_only_its_session(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = Journal(path)
    _grow(journal, "a", 4)
    _grow(journal, "b", 4)
    journal.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE events SET payload = ? WHERE sid = 'a' AND sess_seq = 3", (b'{"x": 1}',))
    db.commit()
    db.close()
    report = check_journal(path)
    assert not report.ok and [s.sid for s in report.damaged] == ["a"]
    assert report.sessions["a"].first_bad == 3
    reopened = Journal(path)
    turns = _live(reopened)
    assert len(turns["a"]) == 2 and len(turns["b"]) == 4
    (damage,) = reopened.recovery.damaged
    assert damage.sid == "a" and damage.first == 3 and damage.lost == 2
    assert any(p.name.startswith("j.db.damaged-") for p in reopened.recovery.moved_to)
    _turn(reopened, "a", [{"role": "user", "content": "go on"}], [1, 2, 3], [4], 9)
    reopened.close()
    again = Journal(path)
    assert again.recovery.clean and len(_live(again)["a"]) == 3
    again.close()


def test_flipped_bytes_in_the_file_keep_every_intact_session(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = Journal(path)
    for sid in "abcdef":
        _grow(journal, sid, 3, text=3000)
    journal._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    journal.close()
    db = sqlite3.connect(path)
    (payload,) = db.execute(
        "SELECT payload FROM events WHERE sid = 'c' AND sess_seq = 2"
    ).fetchone()
    db.close()
    middle = len(payload) // 2
    _flip(path, payload[middle : middle + 32])  # inside the payload of c's second turn
    report = check_journal(path)
    assert [s.sid for s in report.damaged] == ["c"] and report.sessions["c"].first_bad == 2
    reopened = Journal(path)
    turns = _live(reopened)
    reopened.close()
    assert [(d.sid, d.first, d.lost) for d in reopened.recovery.damaged] == [("c", 2, 2)]
    assert {sid: len(t) for sid, t in turns.items()} == {
        "a": 3,
        "b": 3,
        "c": 1,
        "d": 3,
        "e": 3,
        "f": 3,
    }


def test_a_file_cut_short_keeps_what_is_left(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = Journal(path)
    for sid in "abcd":
        _grow(journal, sid, 3, text=3000)
    journal._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    journal.close()
    os.truncate(path, path.stat().st_size * 2 // 3)
    reopened = Journal(path)
    turns = _live(reopened)
    reopened.close()
    damaged = {d.sid for d in reopened.recovery.damaged}
    assert damaged and "a" not in damaged  # the first session lies before the cut
    assert len(turns["a"]) == 3
    assert all(len(turns.get(sid, [])) < 3 for sid in damaged)
    assert any(p.name.startswith("j.db.damaged-") for p in reopened.recovery.moved_to)
    assert check_journal(path).ok


def _as_in(new: dict, old: dict) -> dict:
    """`new` with only the keys `old` has, its metadata too."""
    out = {k: new.get(k) for k in old}
    if isinstance(old.get("metadata"), dict):
        out["metadata"] = {k: new["metadata"].get(k) for k in old["metadata"]}
    return out


def test_schema_1_journals_are_read_and_migrated(tmp_path: Path) -> None:
    from tokentrail.adapter import Adapter
    from tokentrail.engines.scripted import ScriptedEngine
    from tokentrail.storage.replay import as_recorded
    from tokentrail.text.tokenizer import load_tokenizer

    support = Path(__file__).parent / "support"
    expected = json.loads((support / "journal_v1.expected.json").read_text())
    path = tmp_path / "old.db"
    shutil.copyfile(support / "journal_v1.db", path)
    finished = as_recorded(read_journal(path))["job-0"]
    # What the release that wrote it answered; fields added since are not compared.
    assert [
        _as_in(s.to_dict(), old)
        for s, old in zip(finished.samples, expected["job-0"]["samples"], strict=True)
    ] == expected["job-0"]["samples"]
    old_turns = expected["job-0"]["ledger"]["turns"]
    new_turns = finished.ledger.to_dict()["turns"]
    assert [
        {k: t[k] for k in old} for t, old in zip(new_turns, old_turns, strict=True)
    ] == old_turns
    tokenizer = load_tokenizer()
    journal = Journal(path)
    assert journal.recovery.migrated_from == 1 and journal.recovery.live == ["job-1"]
    adapter = Adapter(engine=ScriptedEngine(tokenizer), tokenizer=tokenizer, journal=journal)
    import asyncio

    trajectory = asyncio.run(adapter.finish_trajectory("job-1", reward=0.5))
    journal.close()
    assert [
        _as_in(s.to_dict(), old)
        for s, old in zip(trajectory.samples, expected["job-1"]["samples"], strict=True)
    ] == expected["job-1"]["samples"]
    assert any(p.name.startswith("old.db.schema1-") for p in journal.recovery.moved_to)
    assert check_journal(path).ok


def test_journal_check_and_compact_commands(tmp_path: Path, capsys) -> None:
    from tokentrail.cli import main

    path = tmp_path / "j.db"
    journal = Journal(path)
    _grow(journal, "done", 3)
    journal.session_finished("done", 1.0, {})
    _grow(journal, "live", 2)
    journal.close()
    assert main(["journal", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "done" in out and "finished" in out and "ok: every event is intact" in out
    before = path.stat().st_size
    samples = tmp_path / "done.jsonl"
    holder = Journal(path)
    assert main(["journal", "compact", str(path)]) == 1  # not while a server holds it
    assert f"in use by process {os.getpid()}" in capsys.readouterr().err
    holder.close()
    assert main(["journal", "compact", str(path), "--export", str(samples)]) == 0
    out = capsys.readouterr().out
    assert "removed 1 sessions" in out and samples.exists()
    assert len(samples.read_text().splitlines()) == 1
    assert read_journal(path).sessions() == ["live"]
    assert path.stat().st_size <= before
    db = sqlite3.connect(path)
    db.execute("UPDATE events SET crc = crc + 1 WHERE sess_seq = 2")
    db.commit()
    db.close()
    assert main(["journal", "check", str(path)]) == 1
    assert "DAMAGED from #2" in capsys.readouterr().out


def test_session_settings_read_back_from_the_journal_are_the_ones_opened_with() -> None:
    plain = SessionSettings()
    assert plain.journaled() == {
        "sampling_defaults": {},
        "max_context_tokens": 0,
        "history": None,
        "retry": None,
    }
    own = SessionSettings({"temperature": 0.5}, 4096, "render", ["memory extraction"], "fresh")
    assert own.history is History.RENDER and own.retry is Retry.FRESH
    assert own.exclude_patterns == ("memory extraction",)
    for settings in (plain, own):
        assert (
            SessionSettings.from_journal(json.loads(json.dumps(settings.journaled()))) == settings
        )
