"""Restart time and peak memory with a large journal of which 1% of sessions are unfinished.

Writes (once; kept under /tmp) a journal of about `--gb` GB: Claude-Code-like sessions of 40
turns growing to a 64K-token context (real source text and its Qwen3 token ids, as in
`journal_durability.py`), all finished but 1%. Then, in a fresh process each:
the adapter's start with that journal (open, check, rebuild every unfinished session through
the turn pipeline) against the same start without a journal; `tokentrail journal check`
(every row read); `tokentrail journal compact` (finished sessions removed) and a start on the
compacted file.

    python benches/journal_recovery.py [--gb 1.0] [--path /tmp/tokentrail-recovery.db]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.record import JournaledTurn

TURNS = 40
CONTEXT = 64_000
LIVE_EVERY = 100  # one session in a hundred is unfinished

START = """
import json, sys, time
from tokentrail.adapter import Adapter
from tokentrail.adapter.session.sessions import recover
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.storage.journal import Journal
from tokentrail.text.tokenizer import load_tokenizer
tok = load_tokenizer()
adapter = Adapter(engine=ScriptedEngine(tok), tokenizer=tok)

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

# Reset the peak (VmHWM) to now, so it measures the restart alone.
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS:")
t = time.perf_counter()
journal = Journal(sys.argv[1])
opened = time.perf_counter() - t
adapter.sessions.journal = journal
recover(adapter.sessions, journal)
took = time.perf_counter() - t
rss = status("VmHWM:")
print(json.dumps({"seconds": took, "open": opened, "rss": rss, "before": before,
                  "sessions": len(adapter.sessions),
                  "turns": sum(s.turns for s in adapter.sessions._open.values()),
                  "damaged": len(journal.recovery.damaged)}))
"""


def write(path: Path, gb: float) -> dict[str, int]:
    """Append sessions until the file reaches `gb` GB; every hundredth stays unfinished."""
    from journal_durability import Corpus, claude_code_tools  # benches/ is on the path

    ids = np.random.default_rng(0)
    corpus = Corpus()
    per_turn = CONTEXT // TURNS - 150
    # Pieces of real text with their ids, reused across sessions.
    pool = [corpus.take(per_turn) for _ in range(64)]
    said = [corpus.take(60) for _ in range(16)]
    system = corpus.take(3000)
    tools = claude_code_tools()
    journal = Journal(path)
    sessions = live = turns = 0
    while path.stat().st_size < gb * 1e9:
        sid = f"rollout-{sessions:06d}"
        messages: list[dict] = [
            {"role": "system", "content": system[0]},
            {"role": "user", "content": f"Task {sessions}: refactor the parser."},
        ]
        held = system[1]
        for k in range(TURNS):
            text, new = pool[(sessions + k) % len(pool)]
            messages = [*messages, {"role": "tool", "content": text}]
            prompt = np.concatenate([held, new])
            words, word_ids = said[(sessions + k) % len(said)]
            output = np.concatenate([word_ids, ids.integers(0, 150_000, 90, dtype=np.uint32)])
            output = output.astype(np.uint32)
            call = {"type": "function", "function": {"name": "Read", "arguments": {"p": f"{k}"}}}
            response = {"role": "assistant", "content": words, "tool_calls": [call]}
            journal.turn(
                JournaledTurn(
                    sid,
                    translated=list(messages),
                    response_message=response,
                    tools=tools,
                    prompt_ids=prompt,
                    output_ids=output,
                    logprobs=ids.uniform(-3, 0, len(output)).astype(np.float32),
                    finish_reason="stop",
                    ill_formed=False,
                    metadata={"protocol": "anthropic"},
                    answer={"protocol": "anthropic", "sampling": "{}", "reply": {"text": words}},
                )
            )
            messages = [*messages, response]
            held = np.concatenate([prompt, output])
            turns += 1
        if sessions % LIVE_EVERY == LIVE_EVERY // 2:
            live += 1
        else:
            journal.session_finished(sid, 1.0, {})
        sessions += 1
    journal.close()
    return {"sessions": sessions, "live": live, "turns": turns}


def in_fresh_process(args: list[str]) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    t = time.perf_counter()
    out = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    if out.returncode not in (0, 1):
        raise RuntimeError(out.stderr)
    return time.perf_counter() - t, out.stdout


def start(path: str) -> dict[str, float]:
    _, out = in_fresh_process([sys.executable, "-c", START, path])
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--path", default="/tmp/tokentrail-recovery.db")
    parser.add_argument("--rewrite", action="store_true", help="write the journal again")
    args = parser.parse_args()
    path = Path(args.path)
    info = path.with_suffix(".json")
    if args.rewrite or not path.exists() or not info.exists():
        for p in path.parent.glob(f"{path.name}*"):
            p.unlink()
        t = time.perf_counter()
        made = write(path, args.gb)
        made["write_s"] = int(time.perf_counter() - t)
        info.write_text(json.dumps(made))
    made = json.loads(info.read_text())
    size = sum(
        p.stat().st_size for p in path.parent.glob(f"{path.name}*") if "damaged" not in p.name
    )
    work = path.with_name(f"{path.stem}-work.db")
    for p in path.parent.glob(f"{work.name}*"):
        p.unlink()
    for suffix in ("", "-receipts"):
        shutil.copyfile(f"{path}{suffix}", f"{work}{suffix}")
    full = start(str(work))
    check_s, check_out = in_fresh_process(
        [sys.executable, "-m", "tokentrail", "journal", "check", str(work)]
    )
    compact_s, compact_out = in_fresh_process(
        [sys.executable, "-m", "tokentrail", "journal", "compact", str(work)]
    )
    compacted = start(str(work))
    small = sum(p.stat().st_size for p in work.parent.glob(f"{work.name}*"))
    print(
        f"journal: {size / 1e9:.2f} GB, {made['sessions']} sessions x {TURNS} turns to a "
        f"{CONTEXT // 1000}K context, {made['live']} unfinished ({made['turns']} turns; "
        f"written in {made['write_s']} s)"
    )
    print(
        "restart = open the journal (lock, checks) + rebuild every unfinished session through "
        "the turn pipeline, in a process whose adapter is already up"
    )
    head = ("restart with", "open s", "total s", "peak RSS", "RSS added", "sessions", "turns")
    print(f"{head[0]:<30}" + "".join(f"{h:>11}" for h in head[1:]))
    for name, r in ((f"{size / 1e9:.2f} GB journal", full), ("it, compacted", compacted)):
        print(
            f"{name:<30}{r['open']:>11.2f}{r['seconds']:>11.2f}{r['rss'] / 1e6:>9.0f}MB"
            f"{(r['rss'] - r['before']) / 1e6:>9.0f}MB{r['sessions']:>11}{r['turns']:>11}"
        )
    verdict = check_out.strip().splitlines()[-1] if check_out.strip() else "?"
    print(f"journal check: {check_s:.1f} s ({verdict})")
    print(f"journal compact: {compact_s:.1f} s -> {small / 1e6:.1f} MB ({compact_out.strip()})")
    print(
        f"page cache warm (the file was just written or read); machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}"
    )
    for p in work.parent.glob(f"{work.name}*"):
        p.unlink()


if __name__ == "__main__":
    main()
