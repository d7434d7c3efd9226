"""What a crash loses is stated where trainers look: a session whose journaled turns did not
come back finishes with the loss in its answer, its ledger, its samples' metadata, the admin
list of damaged sessions and `tokentrail audit`, never as a session that generated nothing.

The damage cases: a killed `tokentrail serve` whose WAL then has 64 bytes flipped (the real
CLI, SIGKILL, restart); a WAL cut short or deleted; the main file flipped or cut after a
checkpoint; and a journal writer SIGKILLed inside WAL checkpoints and at random points of long
sessions. Each checks the loss accounting: per session, the turns kept plus the turns stated
lost are the turns it had.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from support.journal_writer import Kills, kill_rounds, verify
from support.retrying_client import ADMIN, free_port, serve, stop
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.cli import main as cli_main
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.errors import SessionDamaged
from tokentrail.kinds import JournalEvent
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.read import check_journal, read_journal
from tokentrail.storage.replay import as_recorded

pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGKILL")

SESSIONS, TURNS, FINISHED = 12, 6, 4
FILES = ("", "-wal", "-receipts")


# -- driving sessions ---------------------------------------------------------------------------


def _body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 64, "messages": messages}


async def run_sessions(url: str, sids: list[str], turns: int) -> None:
    """Every session's turns, round robin, one request at a time (so the file's layout, and
    what a flip at a given offset hits, is the same on every run)."""
    conversations: dict[str, list[dict[str, Any]]] = {
        sid: [{"role": "user", "content": f"task {sid} " * 40}] for sid in sids
    }
    async with aiohttp.ClientSession() as http:
        for k in range(turns):
            for sid, messages in conversations.items():
                async with http.post(
                    f"{url}/v1/messages", json=_body(messages), headers={"x-api-key": sid}
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    reply = await resp.json()
                messages += [
                    {"role": "assistant", "content": reply["content"]},
                    {"role": "user", "content": f"go on {k}"},
                ]


async def finish(url: str, sid: str, **body: Any) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}/tokentrail/sessions/{sid}/finish", json={"reward": 1.0, **body}, headers=headers
        ) as resp:
            return resp.status, await resp.json()


async def damaged_list(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.get(
            f"{url}/tokentrail/damaged", headers={"Authorization": f"Bearer {ADMIN}"}
        ) as resp:
            assert resp.status == 200
            return dict(await resp.json())


def check_answers(first: dict[str, tuple[int, dict]], accepted: dict[str, tuple[int, dict]]):
    """The loss accounting of every finished session; returns the damaged ones' ids."""
    damaged = set()
    for sid, (status, answer) in first.items():
        ledger = answer["ledger"]
        kept = len(ledger["turns"])
        if status == 200:
            # Intact: every turn is there, and the answer says nothing was lost.
            assert kept == TURNS and answer["lost"] is None, sid
            assert ledger["lost"] == [] and ledger["lost_turns"] == ledger["lost_events"] == 0
            assert all("lost" not in s["metadata"] for s in answer["samples"])
            continue
        damaged.add(sid)
        assert status == 409 and answer["error"]["type"] == "session_damaged", (sid, answer)
        assert "samples" not in answer
        lost = answer["lost"]
        assert lost["turns"] >= 1 and kept + lost["turns"] == TURNS, (sid, kept, lost)
        assert ledger["lost_turns"] == lost["turns"] and ledger["lost"] == lost["spans"]
        assert all(span["first"] >= 1 and span["reason"] for span in lost["spans"])
        assert f"{lost['turns']} turns" in answer["error"]["message"]
        # Accepting the loss gets what is left, the loss stated in the ledger and each sample.
        status2, answer2 = accepted[sid]
        assert status2 == 200 and answer2["lost"] == lost
        assert answer2["ledger"] == ledger
        assert all(s["metadata"]["lost"] == lost for s in answer2["samples"])
        assert bool(answer2["samples"]) == (kept > 0)
    return damaged


# -- a real server, killed, its WAL damaged ----------------------------------------------------


def _post(url: str, sid: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/v1/messages",
        data=json.dumps(_body(messages)).encode(),
        headers={"Content-Type": "application/json", "x-api-key": sid},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return dict(json.loads(resp.read()))


def _finish_over_http(url: str, sid: str, **body: Any) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{url}/tokentrail/sessions/{sid}/finish",
        data=json.dumps({"reward": 1.0, **body}).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        return exc.code, dict(json.loads(exc.read()))


def flip(target: Path, at: float, n: int = 64) -> None:
    data = bytearray(target.read_bytes())
    i = int(len(data) * at)
    data[i : i + n] = bytes(b ^ 0xFF for b in data[i : i + n])
    target.write_bytes(bytes(data))


def test_a_killed_server_whose_wal_is_damaged_states_the_loss(tmp_path: Path, capsys) -> None:
    """The issue's case: 12 sessions x 6 turns with --journal, SIGKILL, 64 bytes of the WAL
    flipped, restart, finish: each session that lost turns says how many, from where, why."""
    journal, port = tmp_path / "run.db", free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve(journal, port, engine="scripted")
    try:
        for s in range(SESSIONS):
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {s} " * 40}]
            for k in range(TURNS):
                reply = _post(url, f"d{s}", messages)
                messages += [
                    {"role": "assistant", "content": reply["content"]},
                    {"role": "user", "content": f"go on {k}"},
                ]
    finally:
        proc.kill()  # SIGKILL
        stop(proc)
    flip(Path(f"{journal}-wal"), 0.5)
    proc = serve(journal, port, engine="scripted")
    try:
        sids = [f"d{s}" for s in range(SESSIONS)]
        first = {sid: _finish_over_http(url, sid) for sid in sids}
        listed = json.loads(urllib.request.urlopen(
            urllib.request.Request(f"{url}/tokentrail/damaged",
                                   headers={"Authorization": f"Bearer {ADMIN}"}), timeout=30
        ).read())  # fmt: skip
        # A repeated finish (within the retention window) answers the same; with accept_lost,
        # what is left.
        assert {sid: _finish_over_http(url, sid) for sid in sids} == first
        accepted = {sid: _finish_over_http(url, sid, accept_lost=True) for sid in sids}
    finally:
        stop(proc)
    damaged = check_answers(first, accepted)
    # The flip in the middle of the WAL costs the sessions written after it, not those before.
    assert damaged and len(damaged) < SESSIONS
    assert {row["session"] for row in listed["sessions"]} == damaged
    for row in listed["sessions"]:
        assert row["lost"] == first[row["session"]][1]["lost"]
    # The journal holds the loss too: audit fails naming the sessions.
    capsys.readouterr()
    assert cli_main(["audit", str(journal)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL: {len(damaged)} sessions lost journaled turns" in out
    assert all(sid in out for sid in damaged)


# -- every damage case, in one process ---------------------------------------------------------


@pytest.fixture(scope="module")
def crashed(tokenizer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A journal of 12 sessions x 6 turns (4 finished) as a SIGKILL leaves it (the files copied
    while the writer holds them), and the same after a checkpoint (everything in the main
    file)."""
    where = tmp_path_factory.mktemp("crashed")

    async def go() -> None:
        journal = Journal(where / "run.db")
        adapter = adapter_on(tokenizer, journal)
        runner, url = await start_server(adapter)
        try:
            sids = [f"s{i:02d}" for i in range(SESSIONS)]
            await run_sessions(url, sids, TURNS)
            for sid in sids[:FINISHED]:
                assert (await finish(url, sid))[0] == 200
            await adapter.offload.drain()
            snapshot(where / "run.db", where / "wal")
            journal._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            snapshot(where / "run.db", where / "checkpointed")
        finally:
            await runner.cleanup()
            journal.close()

    asyncio.run(go())
    return {"wal": where / "wal" / "run.db", "checkpointed": where / "checkpointed" / "run.db"}


def adapter_on(tokenizer, journal: Journal) -> Adapter:
    return Adapter(
        engine=ScriptedEngine(tokenizer),
        tokenizer=tokenizer,
        config=AdapterConfig(admin_token=ADMIN),
        journal=journal,
    )


def snapshot(journal: Path, into: Path) -> None:
    into.mkdir()
    for suffix in FILES:
        if Path(f"{journal}{suffix}").exists():
            shutil.copyfile(f"{journal}{suffix}", into / f"run.db{suffix}")


def _wal(path: Path) -> Path:
    return Path(f"{path}-wal")


DAMAGE: dict[str, tuple[str, Callable[[Path], None]]] = {
    "wal-flipped-at-30%": ("wal", lambda p: flip(_wal(p), 0.3)),
    "wal-cut-at-60%": ("wal", lambda p: os.truncate(_wal(p), int(_wal(p).stat().st_size * 0.6))),
    "wal-deleted": ("wal", lambda p: _wal(p).unlink()),
    "main-file-flipped-at-50%": ("checkpointed", lambda p: flip(p, 0.5)),
    "main-file-flipped-at-90%": ("checkpointed", lambda p: flip(p, 0.9)),
    "main-file-cut-at-70%": ("checkpointed", lambda p: os.truncate(p, int(p.stat().st_size * 0.7))),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_every_damage_case_states_its_loss(
    tokenizer, crashed: dict[str, Path], tmp_path: Path, case: str, capsys
) -> None:
    source, damage = DAMAGE[case]
    path = tmp_path / "run.db"
    for suffix in FILES:
        if Path(f"{crashed[source]}{suffix}").exists():
            shutil.copyfile(f"{crashed[source]}{suffix}", f"{path}{suffix}")
    damage(path)
    unfinished = [f"s{i:02d}" for i in range(FINISHED, SESSIONS)]

    async def go() -> tuple[dict, dict, dict, list[str], str]:
        journal = Journal(path)
        adapter = adapter_on(tokenizer, journal)
        runner, url = await start_server(adapter)
        try:
            reported = sorted({d.sid for d in journal.recovery.damaged})
            # `accept_lost` is a boolean or nothing.
            status, refused = await finish(url, unfinished[0], accept_lost="yes")
            assert status == 400 and "accept_lost" in refused["error"]["message"]
            first = {sid: await finish(url, sid) for sid in unfinished}
            # In process, the same refusal is a `SessionDamaged` carrying the loss.
            for sid, (status, answer) in first.items():
                if status == 409:
                    with pytest.raises(SessionDamaged) as caught:
                        await adapter.finish_trajectory(sid, reward=1.0)
                    assert caught.value.lost == answer["lost"]
            listed = await damaged_list(url)
            accepted = {sid: await finish(url, sid, accept_lost=True) for sid in unfinished}
            await adapter.offload.drain()
            async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
                metrics = await resp.text()
        finally:
            await runner.cleanup()
            journal.close()
        return first, accepted, listed, reported, metrics

    first, accepted, listed, reported, metrics = asyncio.run(go())
    damaged = check_answers(first, accepted)
    lost_turns = sum(first[sid][1]["lost"]["turns"] for sid in damaged)
    assert f"tokentrail_sessions_damaged_total {float(len(damaged))}" in metrics
    assert f"tokentrail_lost_turns_total {float(lost_turns)}" in metrics
    assert {row["session"] for row in listed["sessions"]} == damaged
    assert damaged <= set(reported)
    # Finished sessions (recovery does not read them) state their loss when they are read:
    # in the journal's records, replay and audit.
    records = {r.sid: r for r in read_journal(path).records()}
    ledgers = as_recorded(read_journal(path))
    for i in range(FINISHED):
        sid = f"s{i:02d}"
        assert sid in records, f"{case}: finished {sid} is gone without a word"
        kept = len(records[sid].turns)
        lost = ledgers[sid].ledger.lost_turns
        if kept < TURNS:
            damaged.add(sid)
            assert records[sid].losses(), f"{case}: finished {sid} kept {kept} turns, no loss"
            assert kept + lost == TURNS, (case, sid, kept, lost)
        else:
            assert lost == 0, (case, sid)
    assert damaged, f"{case}: the damage cost no session anything (the test would be vacuous)"
    for sid in damaged & set(first):
        assert ledgers[sid].ledger.lost_turns == first[sid][1]["lost"]["turns"]
    capsys.readouterr()
    assert cli_main(["audit", str(path)]) == 1
    assert "sessions lost journaled turns" in capsys.readouterr().out
    # Every session is finished now: an export of them exits 1 (some are not whole), and the
    # samples it writes say what their sessions lack.
    out = tmp_path / "done.jsonl"
    assert cli_main(["journal", "export", str(path), str(out)]) == 1
    for line in out.read_text().splitlines():
        metadata = json.loads(line)["metadata"]
        assert ("lost" in metadata) == (metadata["session_id"] in damaged), metadata


# -- a writer SIGKILLed inside checkpoints and at random, over long sessions --------------------

WRITER_SESSIONS, WRITER_TURNS, CHECKPOINT_EVERY = 4, 24, 12
# Each round starts a writer on the journal and kills it inside its next checkpoint, or after a
# random number of commits; the last one runs to the end.
ROUNDS = ("checkpoint", "random") * 3


def test_kills_inside_checkpoints_and_at_random_lose_nothing(tmp_path: Path) -> None:
    """SIGKILL on reading `ckpt` (inside `wal_checkpoint`) and after a random number of
    commits, writer after writer on the same journal, until the long sessions are done: every
    acknowledged turn is kept, each exactly as written, none twice, and no loss is stated
    where none happened. Then the main file is damaged after the last checkpoint: every turn
    is kept or stated lost."""
    path = tmp_path / "run.db"

    def after_each(kills: Kills) -> None:
        found = verify(path, kills.acked, WRITER_TURNS)
        assert found["missing"] == found["differ"] == found["too_many"] == 0, found
        assert found["stated_lost"] == 0, found

    kills = kill_rounds(
        path,
        [*ROUNDS, "end"],
        sessions=WRITER_SESSIONS,
        turns=WRITER_TURNS,
        every=CHECKPOINT_EVERY,
        rng=random.Random(35),
        after_each=after_each,
    )
    assert kills.finished, "the writer did not get to the end"
    # Killed on reading `ckpt`: inside the checkpoint unless it returned first (then the
    # writer's `ckpt-done` is in what it wrote before it died).
    assert kills.checkpoint == kills.random == 3 and kills.inside_checkpoint >= 2, kills
    kept = {r.sid: len(r.turns) for r in read_journal(path).records()}
    assert kept == dict.fromkeys(kills.acked, WRITER_TURNS)
    for trajectory in as_recorded(read_journal(path)).values():
        assert len(trajectory.ledger.turns) == WRITER_TURNS and trajectory.ledger.lost == []
    assert check_journal(path).ok

    # Damage to the main file after the last checkpoint: every turn is kept or stated lost.
    assert not _wal(path).exists() or _wal(path).stat().st_size == 0
    flip(path, 0.6, n=4096)
    journal = Journal(path)
    try:
        turns: dict[str, int] = dict.fromkeys(kept, 0)
        lost: dict[str, list[dict]] = {}
        for event in journal.live_events():
            if event.kind is JournalEvent.TURN:
                turns[event.sid] += 1
            elif event.kind is JournalEvent.LOST:
                lost.setdefault(event.sid, []).append(event.data)
    finally:
        journal.close()
    assert lost, "a flipped page in the middle of the file cost no session anything"
    for sid, n in turns.items():
        stated = sum(span["turns"] for span in lost.get(sid, []))
        assert all(span["turns"] >= 0 for span in lost.get(sid, [])), lost[sid]
        assert n + stated == WRITER_TURNS, (sid, n, lost.get(sid))


def test_receipts_of_a_deleted_journal_are_set_aside_not_taken_for_the_new_one(
    tmp_path: Path, caplog
) -> None:
    """The journal file deleted (its receipts kept): the old receipts are moved aside with a
    warning, so the new file's first events are not taken for the old file's lost ones at the
    next start (that reported old sessions lost by a WAL tail, and cut the new receipts)."""
    path = tmp_path / "run.db"
    journal = Journal(path)
    for i in range(30):
        journal.session_opened(f"old{i}", {})
    journal.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    journal = Journal(path)
    assert journal.recovery.clean
    assert "receipts name 30 events of 30 sessions" in caplog.text
    for i in range(5):
        journal.session_opened(f"new{i}", {})
    journal.close()
    journal = Journal(path)
    try:
        assert journal.recovery.clean, journal.recovery.describe()
        assert sorted(journal.recovery.live) == [f"new{i}" for i in range(5)]
    finally:
        journal.close()
    assert len(list(tmp_path.glob("run.db-receipts.orphaned-*"))) == 1
    assert len(Path(f"{path}-receipts").read_text().splitlines()) == 5
