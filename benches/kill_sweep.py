"""Kill sweep: `tokentrail serve --journal` SIGKILLed at every point of the journal-write ->
reply window of every turn, with a client that resends its request until it gets a reply.

For each turn of a simulated coding session and each point (before the journal commit, after
it, after the turn is recorded, after the reply's headers, after the K-th write of its body,
after the whole reply), one run: the server kills itself there, is started again on the same
journal, the client resends the same bytes, the session goes on to its end and is finished.
Each run is compared with an uninterrupted one: turns duplicated (recorded twice), turns lost,
runs identical in samples and ledger. Also: a second server started on a journal the first one
holds.

    python benches/kill_sweep.py [--turns N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.retrying_client import (  # noqa: E402
    RetryingClient,
    compare,
    finish,
    free_port,
    run_session,
    serve,
    stop,
)
from tokentrail.sim.harness import SessionSpec  # noqa: E402

SPEC = SessionSpec(seed=11, steps=6, context_tokens=3000)


def frames_per_turn(where: Path) -> list[int]:
    """How many body writes (SSE frames) each turn's streamed reply takes, from a clean run."""
    journal, port = where / "frames.db", free_port()
    proc = serve(journal, port)
    url = f"http://127.0.0.1:{port}"
    client = RetryingClient(SPEC, "count", stream=True)
    counts = []
    try:
        import support.retrying_client as rc

        original = rc._post

        def counting(url_: str, body: bytes, sid: str) -> bytes:
            raw = original(url_, body, sid)
            counts.append(raw.count(b"\n\n"))
            return raw

        rc._post = counting  # type: ignore[assignment]
        try:
            while not client.done:
                client.step(lambda: url, lambda: None)
        finally:
            rc._post = original  # type: ignore[assignment]
        finish(url, "count")
    finally:
        stop(proc)
    return counts


def points_for(frames: int, stream: bool) -> list[str]:
    """Where to kill. A reply written whole (what this sweep's engine gives: not streamed as
    sampled) goes out in one write, SSE frames or JSON alike (`adapter.turn.whole_reply`), so its
    body has one point inside it; `frames` and `stream` say what the reply holds."""
    del frames, stream
    return ["journal", "journaled", "recorded", "headers", "write-1", "flushed"]


def two_writers(where: Path) -> str:
    journal = where / "two.db"
    first = serve(journal, free_port())
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "tokentrail",
                "serve",
                "--port",
                str(free_port()),
                "--journal",
                str(journal),
            ],
            capture_output=True,
            timeout=120,
            env=env,
        )
    finally:
        stop(first)
    message = second.stderr.decode().strip().splitlines()[-1] if second.stderr else ""
    return f"second server: exit {second.returncode}, first pid {first.pid}: {message}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=0, help="sweep only the first N turns")
    parser.add_argument("--quick", action="store_true", help="two points per turn")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        root = Path(tmp)
        clean = {}
        for stream in (False, True):
            clean[stream], _, _ = run_session(root / f"clean-{stream}", SPEC, stream=stream)
        frames = frames_per_turn(root)
        turns = len(frames) if not args.turns else min(args.turns, len(frames))
        rows: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        failures = []
        n = 0
        for stream in (False, True):
            for turn in range(1, turns + 1):
                points = points_for(frames[turn - 1], stream)
                if args.quick:
                    points = ["journaled", points[-2]]
                for point in points:
                    n += 1
                    where = root / f"run-{n}"
                    answer, client, crashed = run_session(
                        where, SPEC, stream=stream, crash=(point, turn)
                    )
                    result = compare(clean[stream], answer)
                    kind = point if not point.startswith("write-") else "write-K"
                    row = rows[f"{'stream' if stream else 'json'} {kind}"]
                    row["runs"] += 1
                    row["crashed"] += crashed
                    row["retries"] += client.retries
                    for key, value in result.items():
                        row[key] += value
                    if result["duplicated"] or result["lost"] or not result["identical"]:
                        failures.append(json.dumps({"point": point, "turn": turn, **result}))
        writers = two_writers(root)
    total: dict[str, int] = defaultdict(int)
    print(
        f"kill sweep: {n} kill points over {turns} turns x (json, stream) of one simulated "
        f"session (simulated engine: a prompt asked again gets a different reply)"
    )
    head = ("point", "runs", "killed", "resent", "identical", "duplicated", "lost", "replayed")
    print(f"{head[0]:<20}" + "".join(f"{h:>11}" for h in head[1:]))
    for name, row in rows.items():
        cells = [row[k] for k in ("runs", "crashed", "retries", "identical", "duplicated")]
        cells += [row["lost"], row["answered"]]
        print(f"{name:<20}" + "".join(f"{c:>11}" for c in cells))
        for key, value in row.items():
            total[key] += value
    cells = [total[k] for k in ("runs", "crashed", "retries", "identical", "duplicated")]
    cells += [total["lost"], total["answered"]]
    print(f"{'total':<20}" + "".join(f"{c:>11}" for c in cells))
    for line in failures:
        print(f"not identical: {line}")
    print(writers)
    print(
        f"{time.monotonic() - started:.0f} s; machine: {platform.machine()}, {os.cpu_count()} "
        f"cores, {platform.python_implementation()} {platform.python_version()}"
    )


if __name__ == "__main__":
    main()
