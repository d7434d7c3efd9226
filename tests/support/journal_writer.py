"""A journal writer to SIGKILL: long sessions appended turn by turn, with WAL checkpoints.

    python tests/support/journal_writer.py JOURNAL SESSIONS TURNS CHECKPOINT_EVERY

Opens JOURNAL as a restarted server does (recovery included), reads how far each session got,
and goes on appending their turns round robin until every session has TURNS of them. Each
turn's prompt is the previous one, its output and `WIDTH` new ids, so a session grows to a long
context while each journaled turn stores only what is new. After each commit it prints
`ack SID K` (turn K of SID, from 0, is committed); every CHECKPOINT_EVERY commits it prints
`ckpt`, runs `PRAGMA wal_checkpoint(TRUNCATE)` and prints `ckpt-done`; at the end a last
checkpoint and `done`. Every line is flushed before the next step, so a parent that kills it on
reading `ckpt` kills it inside the checkpoint, and one that has read `ack` knows the commit
returned.

`expected_turn(sid, k)` is the turn the writer journals as turn K of SID; `kill_rounds` starts
writer after writer on one journal, SIGKILLing each inside a checkpoint or after a random
number of commits, and `verify` compares what the journal holds with what was acknowledged.
Used by `tests/test_crash_loss.py` and `benches/checkpoint_kills.py`.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokentrail.kinds import JournalEvent
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.read import read_journal
from tokentrail.storage.journal.record import JournaledTurn

WIDTH = 1500
OUTPUT = 8


def _rng(sid: str, k: int) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(f"{sid}/{k}".encode()))


def expected_turn(sid: str, k: int) -> tuple[list[int], list[int]]:
    """(prompt ids, output ids) of turn K of SID."""
    prompt: list[int] = []
    output: list[int] = []
    for j in range(k + 1):
        rng = _rng(sid, j)
        prompt = prompt + output + rng.integers(0, 150_000, WIDTH).tolist()
        output = rng.integers(0, 150_000, OUTPUT).tolist()
    return prompt, output


def _messages(sid: str, k: int) -> list[dict[str, str]]:
    out = [{"role": "system", "content": f"session {sid}"}]
    for j in range(k + 1):
        out.append({"role": "tool", "content": f"{sid} result {j} " + "r" * 600})
        if j < k:
            out.append({"role": "assistant", "content": f"{sid} answer {j}"})
    return out


def main(argv: list[str]) -> int:
    path, sessions, turns, every = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    journal = Journal(path)
    done: dict[str, int] = {f"w{s}": 0 for s in range(sessions)}
    held: dict[str, tuple[list[int], list[int]]] = {}
    for event in journal.live_events():
        if event.kind is JournalEvent.TURN and event.turn is not None:
            done[event.sid] = done.get(event.sid, 0) + 1
            held[event.sid] = (event.turn.prompt_ids.tolist(), event.turn.output_ids.tolist())
    commits = 0
    while any(n < turns for n in done.values()):
        for sid, k in list(done.items()):
            if k >= turns:
                continue
            prompt, output = held.get(sid, ([], []))
            rng = _rng(sid, k)
            prompt = prompt + output + rng.integers(0, 150_000, WIDTH).tolist()
            output = rng.integers(0, 150_000, OUTPUT).tolist()
            journal.turn(
                JournaledTurn(
                    sid,
                    translated=_messages(sid, k),
                    response_message={"role": "assistant", "content": f"{sid} answer {k}"},
                    tools=None,
                    prompt_ids=prompt,
                    output_ids=output,
                    logprobs=[-0.25] * OUTPUT,
                    finish_reason="stop",
                    ill_formed=False,
                    metadata={},
                )
            )
            held[sid] = (prompt, output)
            done[sid] = k + 1
            print(f"ack {sid} {k}", flush=True)
            commits += 1
            if every and commits % every == 0:
                _checkpoint(journal)
    _checkpoint(journal)
    print("done", flush=True)
    journal.close()
    return 0


def _checkpoint(journal: Journal) -> None:
    print("ckpt", flush=True)
    journal._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # noqa: SLF001 - the test's point
    print("ckpt-done", flush=True)


# -- the parent's side ---------------------------------------------------------------------------


@dataclass
class Kills:
    """What `kill_rounds` did: kills by plan, those that landed inside a checkpoint (the
    writer never printed `ckpt-done`), the last turn acknowledged per session, and whether
    the last writer got to the end."""

    checkpoint: int = 0
    inside_checkpoint: int = 0
    random: int = 0
    acked: dict[str, int] = field(default_factory=dict)
    finished: bool = False


def start(path: Path, sessions: int, turns: int, every: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    args = [str(path), str(sessions), str(turns), str(every)]
    return subprocess.Popen(
        [sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True, env=env
    )


def kill_rounds(
    path: Path,
    plans: Iterable[str],
    *,
    sessions: int,
    turns: int,
    every: int,
    rng: random.Random,
    after_each: Callable[[Kills], None] = lambda kills: None,
) -> Kills:
    """One writer per plan ("checkpoint": SIGKILL on reading `ckpt`; "random": after 5 to
    2 x `every` commits; "end": let it finish), `after_each` called after each."""
    kills = Kills()
    for plan in plans:
        proc = start(path, sessions, turns, every)
        assert proc.stdout is not None
        budget = rng.randint(5, 2 * every)
        killed = False
        for line in proc.stdout:
            word, *rest = line.split()
            if word == "ack":
                kills.acked[rest[0]] = int(rest[1])
                budget -= 1
                if plan == "random" and budget <= 0:
                    killed = True
                    break
            elif word == "ckpt" and plan == "checkpoint":
                killed = True
                break
            elif word == "done":
                kills.finished = True
        if killed:
            proc.kill()  # SIGKILL
        rest_of_output = proc.stdout.read()
        proc.wait(timeout=60)
        proc.stdout.close()
        if killed and plan == "checkpoint":
            kills.checkpoint += 1
            kills.inside_checkpoint += "ckpt-done" not in rest_of_output
        kills.random += killed and plan == "random"
        after_each(kills)
        if kills.finished:
            break
    return kills


def verify(path: Path, acked: dict[str, int], turns: int) -> dict[str, int]:
    """What the journal holds against what was acknowledged: turns kept, acknowledged turns
    missing, turns kept that differ from what was written, sessions past `turns` (a turn
    journaled twice), and turns stated lost."""
    out = {"kept": 0, "missing": 0, "differ": 0, "too_many": 0, "stated_lost": 0}
    for record in read_journal(path).records():
        out["stated_lost"] += sum(max(span.turns, 1) for span in record.losses())
        n = len(record.turns)
        out["kept"] += n
        out["missing"] += max(0, acked.get(record.sid, -1) + 1 - n)
        out["too_many"] += n > turns
        prompt: list[int] = []
        output: list[int] = []
        for k, turn in enumerate(record.turns):
            # Turn k is turn k-1's prompt and output and its own new ids (`expected_turn`,
            # built up one turn at a time).
            rng = _rng(record.sid, k)
            prompt = prompt + output + rng.integers(0, 150_000, WIDTH).tolist()
            output = rng.integers(0, 150_000, OUTPUT).tolist()
            out["differ"] += (turn.prompt_ids.tolist(), turn.output_ids.tolist()) != (
                prompt,
                output,
            )
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
