"""Damaged journals: what is reported, what is kept, per session.

A journal of 12 sessions (8 unfinished, 4 finished) x 6 turns is left as a crash leaves it
(database, WAL, receipts); then its WAL is cut short or has 64 bytes flipped, or (after a
checkpoint, everything in the main file) the main file has 64 bytes flipped or is cut short.
Each damaged copy is opened as a restarting server would (recovery), and everything recovered
is compared with what was written: turns kept intact, turns lost and reported, turns lost
without a report (silent), turns kept but wrong.

    python benches/journal_damage.py
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tokentrail.kinds import JournalEvent
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.read import read_journal
from tokentrail.storage.journal.record import JournaledTurn
from tokentrail.trajectory.lost import lost_turns, total

SESSIONS, TURNS, FINISHED = 12, 6, 4
Truth = dict[str, list[list[int]]]


def write(path: Path, checkpoint: bool) -> Truth:
    """The journal, and per session the prompt ids of each turn, as written."""
    journal = Journal(path)
    rng = np.random.default_rng(1)
    truth: Truth = {}
    for s in range(SESSIONS):
        sid = f"s{s:02d}"
        held: list[int] = []
        messages = [{"role": "system", "content": f"session {sid} " + "x" * 500}]
        for k in range(TURNS):
            messages = [*messages, {"role": "tool", "content": f"{sid}-{k} " + "r" * 1500}]
            prompt = held + rng.integers(0, 150_000, 400).tolist()
            journal.turn(
                JournaledTurn(
                    sid,
                    translated=list(messages),
                    response_message={"role": "assistant", "content": f"a{k}"},
                    tools=None,
                    prompt_ids=prompt,
                    output_ids=[1, 2, 3, k],
                    logprobs=[-0.5] * 4,
                    finish_reason="stop",
                    ill_formed=False,
                    metadata={},
                )
            )
            truth.setdefault(sid, []).append(prompt)
            messages = [*messages, {"role": "assistant", "content": f"a{k}"}]
            held = prompt + [1, 2, 3, k]
        if s < FINISHED:
            journal.session_finished(sid, 1.0, {})
    if checkpoint:
        journal._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        journal.close()
    else:
        # What a SIGKILL leaves: copy the files while the writer still has them open.
        crashed = path.with_name(f"crashed-{path.name}")
        for suffix in ("", "-wal", "-receipts"):
            shutil.copyfile(f"{path}{suffix}", f"{crashed}{suffix}")
        journal.close()
        for suffix in ("", "-wal", "-receipts"):
            os.replace(f"{crashed}{suffix}", f"{path}{suffix}")
    return truth


def flip(target: Path, at: float) -> None:
    data = bytearray(target.read_bytes())
    i = int(len(data) * at)
    data[i : i + 64] = bytes(b ^ 0xFF for b in data[i : i + 64])
    target.write_bytes(bytes(data))


def cut(target: Path, at: float) -> None:
    os.truncate(target, int(target.stat().st_size * at))


def recover(path: Path) -> tuple[dict[str, list[list[int]]], dict[str, int], int]:
    """Turns kept per session (unfinished ones as recovery yields them, finished ones as the
    file holds them afterwards), the turns each session reported damaged states it lost (by
    recovery's `lost` events, or, for finished sessions, which recovery does not read, when
    they are read; -1: an unknown number), and how many sessions recovery reported."""
    journal = Journal(path)
    kept: dict[str, list[list[int]]] = {}
    stated: dict[str, int] = {}
    for event in journal.live_events():
        if event.kind is JournalEvent.TURN and event.turn is not None:
            kept.setdefault(event.sid, []).append(event.turn.prompt_ids.tolist())
        elif event.kind is JournalEvent.LOST:
            stated[event.sid] = total([stated.get(event.sid, 0), int(event.data["turns"])])
    at_start = len({d.sid for d in journal.recovery.damaged})
    journal.close()
    for record in read_journal(path).records():
        if record.state == "finished":
            kept[record.sid] = [t.prompt_ids.tolist() for t in record.turns]
            spans = record.losses()
            if spans:
                stated[record.sid] = lost_turns(spans)
    return kept, stated, at_start


def score(truth: Truth, kept: dict[str, list[list[int]]], stated: dict[str, int]) -> dict[str, int]:
    out = {"kept": 0, "lost_reported": 0, "lost_silent": 0, "wrong": 0, "sessions_intact": 0}
    out["stated"] = out["miscounted"] = 0
    for sid, turns in truth.items():
        mine = kept.get(sid, [])
        good = sum(1 for a, b in zip(turns, mine, strict=False) if a == b)
        out["wrong"] += len(mine) - good
        out["kept"] += good
        lost = len(turns) - good
        out["lost_reported" if sid in stated else "lost_silent"] += lost
        out["sessions_intact"] += lost == 0 and len(mine) == len(turns)
        if sid in stated:
            out["stated"] += max(stated[sid], 0)
            # The loss a finish states: the turns the session had less those it kept.
            out["miscounted"] += stated[sid] != lost
    return out


SCENARIOS: list[tuple[str, bool, str, Callable[[Path], None]]] = [
    *[
        (f"WAL cut at {int(f * 100)}%", False, "-wal", lambda p, f=f: cut(p, f))
        for f in (0.25, 0.5, 0.75, 0.95)
    ],
    *[
        (f"WAL 64 B flipped at {int(f * 100)}%", False, "-wal", lambda p, f=f: flip(p, f))
        for f in (0.1, 0.5, 0.9)
    ],
    *[
        (f"file 64 B flipped at {int(f * 100)}%", True, "", lambda p, f=f: flip(p, f))
        for f in (0.1, 0.3, 0.5, 0.7, 0.9)
    ],
    ("file cut at 66%", True, "", lambda p: cut(p, 0.66)),
]


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        for name, checkpoint, suffix, damage in SCENARIOS:
            where = Path(tmp) / name.replace(" ", "_").replace("%", "")
            where.mkdir()
            path = where / "run.db"
            truth = write(path, checkpoint)
            damage(Path(f"{path}{suffix}"))
            kept, stated, n = recover(path)
            rows.append((name, n, score(truth, kept, stated)))
    total = SESSIONS * TURNS
    print(
        f"damaged journals: {SESSIONS} sessions ({SESSIONS - FINISHED} unfinished) x {TURNS} "
        f"turns = {total} turns each"
    )
    head = (
        "damage",
        "reported at open",
        "intact sessions",
        "turns kept",
        "lost, reported",
        "lost, silent",
        "kept but wrong",
        "lost, stated",
        "miscounted",
    )
    print(f"{head[0]:<26}" + "".join(f"{h:>18}" for h in head[1:]))
    print("(finished sessions are not read at open; their damage is reported when they are read;")
    print(" 'lost, stated': the lost turns the sessions' finish states; 'miscounted': sessions")
    print(" whose stated count is not the turns they lost)")
    for name, n, r in rows:
        cells = (
            n,
            r["sessions_intact"],
            r["kept"],
            r["lost_reported"],
            r["lost_silent"],
            r["wrong"],
            r["stated"],
            r["miscounted"],
        )
        print(f"{name:<26}" + "".join(f"{c:>18}" for c in cells))
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )


if __name__ == "__main__":
    main()
