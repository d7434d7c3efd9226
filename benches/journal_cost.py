"""What the journal adds to a turn: server CPU per turn with the journal on and off.

A Claude-Code-like session (`sessions.py`: Claude Code's tool list and echo rewrites, one tool
call and about 1,000 characters of tool output per turn) is recorded once per context size;
each turn then goes through the adapter's own steps in process (request reader, the pipeline's
prepare and record, as `sessions.replay_in_process`), with or without `journal_turn` (what the
adapter journals before a reply leaves: the turn's new messages and ids, SQLite in WAL mode).
Time is process CPU (what a loaded machine's preemptions do not inflate), per turn over the
second half of the session; every session is replayed off then on once a round, round after
round (`--repeats` rounds), medians. Beside them: "on-off", the difference of those medians;
"journal ms", `journal_turn` alone, timed around its call (the same medians); the bytes of a
turn's event over that half (payload and ids, median).

Two sets of sessions: `--turns` turns to each context, so that a turn adds more at a larger
context (its tool result is padded to reach it); and sessions whose history grows while every
turn adds the same (`--turns` turns per first context's worth, each tool result the same size),
where a journal whose per-turn cost grew with the history would show it.

    python benches/journal_cost.py [--turns 48] [--contexts 16384,65536,131072]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from report import Report, machine
from sessions import RecordedTurn, Sampled, parsed_replies, record_session

from tokentrail.adapter import Adapter
from tokentrail.adapter.config import AdapterConfig
from tokentrail.adapter.protocols.anthropic import AnthropicMessages
from tokentrail.adapter.turn.turns import journal_turn
from tokentrail.sim.model import SimulatedEngine
from tokentrail.storage.journal import Journal
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer
from tokentrail.trajectory.pipeline import ParsedTurn
from tokentrail.trajectory.timing import TurnTiming


def replay(
    tokenizer: LoadedTokenizer,
    turns: list[RecordedTurn],
    replies: list[dict[str, Any]],
    journal_path: Path | None,
) -> tuple[list[float], list[float], list[int]]:
    """CPU seconds of each turn, of each turn's journaling alone, and the bytes each turn's
    event holds (the last two empty without a journal)."""
    proto, sid = AnthropicMessages(), "s"
    config = AdapterConfig(request_memo=256, workers=0)
    adapter = Adapter(engine=SimulatedEngine(tokenizer), tokenizer=tokenizer, config=config)
    journal = Journal(journal_path) if journal_path is not None else None
    pipeline = adapter.pipeline
    spent: list[float] = []
    journaling: list[float] = []
    sizes: list[int] = []
    try:
        for k, (turn, reply) in enumerate(zip(turns, replies, strict=True)):
            start = time.process_time()
            request = adapter.requests.request(proto, turn.body, sid, {"x-api-key": sid})
            prepared = pipeline.prepare(sid, request.conversation, timing=TurnTiming())
            sampled = Sampled(turn.output_ids, turn.logprobs, turn.finish_reason)
            if journal is not None:
                began = time.process_time()
                metadata = dataclasses.replace(
                    prepared.tags,
                    protocol=proto.name,
                    request_id=f"r{k}",
                    reply_id=f"msg_{k}",
                    call_ids=(),
                    history=str(prepared.history),
                ).as_metadata()
                parsed = ParsedTurn(reply, reply)
                journal_turn(journal, prepared, sampled, parsed, metadata, answer={"reply": reply})  # type: ignore[arg-type]
                journaling.append(time.process_time() - began)
            pipeline.record(prepared, sampled, reply)
            spent.append(time.process_time() - start)
    finally:
        if journal is not None:
            journal.close()
    if journal_path is not None:
        db = sqlite3.connect(journal_path)
        try:
            query = "SELECT length(payload) + length(ids) FROM events WHERE kind = 'turn'"
            sizes = [n for (n,) in db.execute(query + " ORDER BY seq")]
        finally:
            db.close()
    return spent, journaling, sizes


def late_median_ms(spent: list[float]) -> float:
    return float(np.median(spent[len(spent) // 2 :])) * 1e3


HEADER = (
    f"{'context':>8}{'turns':>7}{'messages':>9}{'off ms':>9}{'on ms':>9}{'on/off':>8}"
    f"{'on-off ms':>10}{'journal ms':>11}{'KB/turn':>9}"
)


@dataclass
class Played:
    """One session and what its replays measured (milliseconds, kilobytes)."""

    context: int
    turns: list[RecordedTurn]
    replies: list[dict[str, Any]]
    off: list[float] = field(default_factory=list)
    on: list[float] = field(default_factory=list)
    alone: list[float] = field(default_factory=list)
    per_turn: list[float] = field(default_factory=list)

    def play(self, tokenizer: LoadedTokenizer) -> None:
        """Replay it once without the journal, then once with it."""
        self.off.append(late_median_ms(replay(tokenizer, self.turns, self.replies, None)[0]))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "journal.db"
            spent, journaling, sizes = replay(tokenizer, self.turns, self.replies, path)
        self.on.append(late_median_ms(spent))
        self.alone.append(late_median_ms(journaling))
        self.per_turn.append(float(np.median(sizes[len(sizes) // 2 :])) / 1e3)

    def line(self) -> str:
        a, b = float(np.median(self.off)), float(np.median(self.on))
        messages = len(json.loads(self.turns[-1].body)["messages"])
        return (
            f"{self.context:>8}{len(self.turns):>7}{messages:>9}{a:>9.2f}{b:>9.2f}{b / a:>7.2f}x"
            f"{b - a:>10.2f}{float(np.median(self.alone)):>11.3f}"
            f"{float(np.median(self.per_turn)):>9.1f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=48)
    parser.add_argument("--contexts", default="16384,65536,131072")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    tokenizer = load_tokenizer()
    contexts = [int(c) for c in args.contexts.split(",")]
    sets: list[list[Played]] = []
    for grows in (False, True):
        played = []
        for context in contexts:
            n = args.turns * context // contexts[0] if grows else args.turns
            turns = record_session(tokenizer, n, context)
            played.append(Played(context, turns, parsed_replies(tokenizer, turns)))
        sets.append(played)
    # Every session replayed once per round, round after round: what the machine's load does
    # to one, it does to the others.
    for _ in range(args.repeats):
        for played in sets:
            for session in played:
                session.play(tokenizer)
    out = Report("journal_cost")
    out.line(
        f"server CPU per turn (process CPU, median over the second half of the session; medians "
        f"of {args.repeats} rounds, each session replayed off then on once a round)"
    )
    titles = (
        f"{args.turns}-turn sessions to each context (a turn adds more at a larger context):",
        f"the history grows, each turn adds the same ({args.turns} turns per {contexts[0]} "
        "tokens of context):",
    )
    for title, played in zip(titles, sets, strict=True):
        out.line()
        out.line(title)
        out.line(HEADER)
        for session in played:
            out.line(session.line())
    out.line(f"machine: {machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
