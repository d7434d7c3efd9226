"""What the journal adds to a turn: server CPU per turn with the journal on and off.

A Claude-Code-like session (`sessions.py`: Claude Code's tool list and echo rewrites, one tool
call and about 1,000 characters of tool output per turn) is recorded once per context size;
each turn then goes through the adapter's own steps in process (request reader, the pipeline's
prepare and record, as `sessions.replay_in_process`), with or without `journal_turn` (what the
adapter journals before a reply leaves: the turn's new messages and ids, SQLite in WAL mode).
Time is process CPU (what a loaded machine's preemptions do not inflate), per turn over the
second half of the session; off and on alternate, `--repeats` times each, medians. Beside
them: the bytes of a turn's event over that half (payload and ids, median).

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
) -> tuple[list[float], list[int]]:
    """CPU seconds of each turn, and the bytes each turn's event holds (none without a
    journal)."""
    proto, sid = AnthropicMessages(), "s"
    config = AdapterConfig(request_memo=256, workers=0)
    adapter = Adapter(engine=SimulatedEngine(tokenizer), tokenizer=tokenizer, config=config)
    journal = Journal(journal_path) if journal_path is not None else None
    pipeline = adapter.pipeline
    spent: list[float] = []
    sizes: list[int] = []
    try:
        for k, (turn, reply) in enumerate(zip(turns, replies, strict=True)):
            start = time.process_time()
            request = adapter.requests.request(proto, turn.body, sid, {"x-api-key": sid})
            prepared = pipeline.prepare(sid, request.conversation, timing=TurnTiming())
            sampled = Sampled(turn.output_ids, turn.logprobs, turn.finish_reason)
            if journal is not None:
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
    return spent, sizes


def late_median_ms(spent: list[float]) -> float:
    return float(np.median(spent[len(spent) // 2 :])) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=48)
    parser.add_argument("--contexts", default="16384,65536,131072")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    tokenizer = load_tokenizer()
    out = Report("journal_cost")
    out.line(
        f"server CPU per turn (process CPU, median over the second half of a {args.turns}-turn "
        f"session; medians of {args.repeats} replays each), journal off and on"
    )
    out.line(
        f"{'context':>8}{'messages':>9}{'off ms':>9}{'on ms':>9}{'on/off':>8}"
        f"{'journal ms':>11}{'KB/turn':>9}"
    )
    for context in (int(c) for c in args.contexts.split(",")):
        turns = record_session(tokenizer, args.turns, context)
        replies = parsed_replies(tokenizer, turns)
        off, on, per_turn = [], [], []
        for _ in range(args.repeats):
            off.append(late_median_ms(replay(tokenizer, turns, replies, None)[0]))
            with tempfile.TemporaryDirectory() as tmp:
                spent, sizes = replay(tokenizer, turns, replies, Path(tmp) / "journal.db")
            on.append(late_median_ms(spent))
            per_turn.append(float(np.median(sizes[len(sizes) // 2 :])) / 1e3)
        a, b = float(np.median(off)), float(np.median(on))
        messages = len(json.loads(turns[-1].body)["messages"])
        out.line(
            f"{context:>8}{messages:>9}{a:>9.2f}{b:>9.2f}{b / a:>7.2f}x{b - a:>11.2f}"
            f"{float(np.median(per_turn)):>9.1f}"
        )
    out.line(f"machine: {machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
