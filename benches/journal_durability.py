"""What the journal costs per turn: bytes stored and append latency, at realistic contexts.

One Claude-Code-like session of 40 turns grows to a 16K, 64K or 160K-token context: every turn
the harness sends the whole conversation again (a system prompt, Claude Code's real tool list
where `tests/fixtures` has it, every earlier assistant message and tool result) plus one new
tool result, a piece of a real source file (CPython's standard library), and the prompt ids
extend the previous turn's by that text's tokens in the Qwen3 vocabulary. The same turns are
appended by this journal (schema 2: what is new since the turn it continues) and by a faithful
copy of the previous release's writer (schema 1: the messages twice in full, the prompt as a
tail), under `synchronous=NORMAL` and `FULL`.

    python benches/journal_durability.py [--turns 40]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import sqlite3
import sysconfig
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokentrail.sim.harness import CLAUDE_CODE_TOOLS
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.record import JournaledTurn

FIXTURE = (
    Path(__file__).resolve().parents[1] / "tests/fixtures/claude_code_2.1.197_edit_write_bash.json"
)
SYSTEM_TOKENS = 3000
OUTPUT_TOKENS = 150


class Corpus:
    """Real text and its real token ids: the standard library's source, in order."""

    def __init__(self) -> None:
        from tokentrail.text.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer()
        root = Path(sysconfig.get_paths()["stdlib"])
        self.files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 4000)
        self.at = 0
        self.buffer = ""

    def take(self, tokens: int) -> tuple[str, np.ndarray]:
        """The next piece of about `tokens` tokens, and its ids."""
        while len(self.buffer) < tokens * 6:
            self.buffer += self.files[self.at % len(self.files)].read_text(errors="replace")
            self.at += 1
        ids = self.tokenizer.encode(self.buffer[: tokens * 6])[:tokens]
        text = self.tokenizer.decode(ids)
        self.buffer = self.buffer[len(text) :]
        return text, np.asarray(ids, dtype=np.uint32)


def claude_code_tools() -> list[dict[str, Any]]:
    """Claude Code's tool list as the adapter translates it (the sim's where no fixture)."""
    from tokentrail.adapter.protocols.anthropic import translate_request

    tools = CLAUDE_CODE_TOOLS
    if FIXTURE.exists():
        tools = json.loads(FIXTURE.read_text())["exchanges"][0]["request"]["tools"]
    conv = translate_request({"messages": [{"role": "user", "content": "x"}], "tools": tools})
    return conv.tools or []


@dataclass
class Turn:
    translated: list[dict[str, Any]]
    response: dict[str, Any]
    prompt: np.ndarray
    output: np.ndarray
    logprobs: np.ndarray
    answer: dict[str, Any]
    new_text: int  # bytes of the text this turn adds (its new tool result, its reply)


def session(context: int, turns: int, corpus: Corpus) -> Iterator[Turn]:
    ids = np.random.default_rng(context)
    per_turn = max(50, (context - SYSTEM_TOKENS) // turns - OUTPUT_TOKENS)
    system, held = corpus.take(SYSTEM_TOKENS)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Refactor the parser module and keep the tests green."},
    ]
    for k in range(turns):
        result, new = corpus.take(per_turn)
        messages = [*messages, {"role": "tool", "content": result}]
        prompt = np.concatenate([held, new])
        said, said_ids = corpus.take(60)
        output = np.concatenate([said_ids, ids.integers(0, 150_000, OUTPUT_TOKENS - 60)])
        output = output.astype(np.uint32)
        call = {"type": "function", "function": {"name": "Read", "arguments": {"path": f"m{k}"}}}
        response = {"role": "assistant", "content": said, "tool_calls": [call]}
        answer = {
            "protocol": "anthropic",
            "sampling": '{"max_new_tokens":4096}',
            "reply": {"id": f"msg_{k:024d}", "content": [{"type": "text", "text": said}]},
        }
        yield Turn(
            list(messages),
            response,
            prompt,
            output,
            ids.uniform(-3, 0, OUTPUT_TOKENS).astype(np.float32),
            answer,
            len(result.encode()) + len(said.encode()),
        )
        messages = [*messages, response]
        held = np.concatenate([prompt, output])


class Schema1:
    """The previous release's writer (schema 1), as it was: one row per event, the translated
    and the restored messages in full, the prompt ids as base64 of the tail past the last turn."""

    def __init__(self, path: Path, sync: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={sync.upper()}")
        self.db.execute(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, sid TEXT NOT NULL, "
            "kind TEXT NOT NULL, payload BLOB NOT NULL, crc INTEGER NOT NULL)"
        )
        self.last: dict[str, tuple[int, np.ndarray]] = {}

    def turn(self, sid: str, t: Turn, tools: list[dict[str, Any]]) -> None:
        base_seq, prefix = 0, 0
        if sid in self.last:
            base_seq, held = self.last[sid]
            n = min(len(held), len(t.prompt))
            diff = np.flatnonzero(held[:n] != t.prompt[:n])
            prefix = int(diff[0]) if len(diff) else n
        b64 = lambda a, d: base64.b64encode(np.asarray(a, dtype=d).tobytes()).decode()  # noqa: E731
        data = {
            "translated": t.translated,
            "prompt_messages": t.translated,  # the restored messages: as large
            "response_message": t.response,
            "tools": tools,
            "base": base_seq,
            "prefix": prefix,
            "tail": b64(t.prompt[prefix:], "<u4"),
            "output": b64(t.output, "<u4"),
            "logprobs": b64(t.logprobs, "<f4"),
            "finish_reason": "stop",
            "ill_formed": False,
            "metadata": {"protocol": "anthropic", "request_id": "r" * 32},
            "history": "splice",
            "fallback": None,
        }
        payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
        cur = self.db.execute(
            "INSERT INTO events (sid, kind, payload, crc) VALUES (?, ?, ?, ?)",
            (sid, "turn", payload, zlib.crc32(payload)),
        )
        tail = np.frombuffer(base64.b64decode(data["tail"]), dtype="<u4")
        prompt = np.concatenate([self.last[sid][1][:prefix], tail]) if base_seq else tail
        self.last[sid] = (int(cur.lastrowid or 0), np.concatenate([prompt, t.output]))

    def stored(self) -> int:
        return int(self.db.execute("SELECT sum(length(payload)) FROM events").fetchone()[0])

    def close(self) -> None:
        self.db.close()


def run(schema: int, sync: str, context: int, turns: list[Turn], where: Path) -> dict[str, float]:
    path = where / f"s{schema}-{sync}-{context}.db"
    tools = claude_code_tools()
    times, new_text = [], 0
    writer: Any = Schema1(path, sync) if schema == 1 else Journal(path, sync=sync)
    for t in turns:
        start = time.perf_counter()
        if schema == 1:
            writer.turn("s", t, tools)
        else:
            writer.turn(
                JournaledTurn(
                    "s",
                    translated=t.translated,
                    response_message=t.response,
                    tools=tools,
                    prompt_ids=t.prompt,
                    output_ids=t.output,
                    logprobs=t.logprobs,
                    finish_reason="stop",
                    ill_formed=False,
                    metadata={"protocol": "anthropic", "request_id": "r" * 32},
                    answer=t.answer,
                )
            )
        times.append(time.perf_counter() - start)
        new_text += t.new_text
    if schema == 1:
        stored = writer.stored()
    else:
        db = sqlite3.connect(path)
        (stored,) = db.execute(
            "SELECT (SELECT sum(length(payload) + length(ids)) FROM events) + "
            "(SELECT coalesce(sum(length(data)), 0) FROM blobs)"
        ).fetchone()
        db.close()
    writer.close()
    files = sum(p.stat().st_size for p in where.glob(f"{path.name}*"))
    ms = np.array(times) * 1e3
    return {
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "stored": stored / len(turns),
        "file": files / len(turns),
        "new_text": new_text / len(turns),
        "context": float(len(t.prompt) + len(t.output)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--contexts", default="16000,64000,160000")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per row; latencies are their median"
    )
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    rows = []
    corpus = Corpus()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        for context in contexts:
            turns = list(session(context, args.turns, corpus))
            for sync in ("normal", "full"):
                for schema in (1, 2):
                    runs = []
                    for r in range(args.repeat):
                        where = Path(tmp) / f"{schema}-{sync}-{context}-{r}"
                        where.mkdir()
                        runs.append(run(schema, sync, context, turns, where))
                    row = dict(runs[0])
                    for key in ("p50", "p99"):
                        row[key] = float(np.median([x[key] for x in runs]))
                    rows.append((context, sync, schema, row))
    print(
        f"journal appends: one session of {args.turns} turns to each final context; "
        "bytes per turn as stored (payload + ids + tool lists) and as files (db + WAL + receipts); "
        f"latencies: the median of {args.repeat} runs"
    )
    head = (
        "context",
        "sync",
        "schema",
        "append p50",
        "p99",
        "bytes/turn",
        "file/turn",
        "new text",
        "stored - new",
    )
    print(f"{head[0]:>8}{head[1]:>8}{head[2]:>8}" + "".join(f"{h:>13}" for h in head[3:]))
    for _, sync, schema, r in rows:
        print(
            f"{r['context'] / 1000:>7.0f}K{sync:>8}{schema:>8}{r['p50']:>11.3f}ms"
            f"{r['p99']:>11.3f}ms{r['stored'] / 1e3:>11.1f}KB{r['file'] / 1e3:>11.1f}KB"
            f"{r['new_text'] / 1e3:>11.1f}KB{(r['stored'] - r['new_text']) / 1e3:>11.1f}KB"
        )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )


if __name__ == "__main__":
    main()
