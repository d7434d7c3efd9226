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

`expected_turn(sid, k)` is the turn the writer journals as turn K of SID, for the parent to
check what recovery brings back.
"""

from __future__ import annotations

import sys
import zlib

import numpy as np

from tokentrail.kinds import JournalEvent
from tokentrail.storage.journal import Journal

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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
