"""Run every benchmark in this folder, one after another, each printing its own table.

    python benches/run_all.py [--quick]

`--quick` passes each bench its smallest setting (a smoke run that checks they all work);
without it each runs its defaults, the settings the README's tables were measured with (the
kill sweep then takes about half an hour and the recovery bench writes a 1 GB journal under
/tmp). The Criterion bench of the Rust core runs with `cargo bench --bench core`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent

# Each bench and the arguments of its smallest run.
BENCHES: list[tuple[str, list[str]]] = [
    ("echo_restore_table.py", []),
    ("harness_behaviours.py", ["--sessions", "1", "--steps", "4"]),
    ("splice_vs_render.py", ["--sessions", "1", "--steps", "4"]),
    ("journal_durability.py", ["--turns", "10", "--contexts", "16000"]),
    ("journal_damage.py", []),
    ("journal_recovery.py", ["--gb", "0.02", "--path", "/tmp/tokentrail-recovery-quick.db"]),
    ("kill_sweep.py", ["--turns", "1", "--quick"]),
    ("checkpoint_kills.py", ["--sessions", "2", "--turns", "12", "--kills", "4"]),
    ("adapter_load.py", ["--sessions", "2", "--turns", "8"]),
    ("session_scaling.py", ["--quick"]),
    ("journal_cost.py", ["--turns", "8", "--contexts", "8192", "--repeats", "1"]),
    ("turn_cost.py", ["--contexts", "4096,8192"]),
    ("against_slime.py", []),
    ("encode_speed.py", ["--vocabularies", "qwen3", "--full-tokens", "4000", "--repeats", "20"]),
    ("routing_replay.py", ["--sessions", "1", "--steps", "4"]),
    ("engine_answers.py", ["--tokens", "8192"]),
    ("families.py", ["--sessions", "1", "--steps", "3", "--messages", "50"]),
    ("loop_responsiveness.py", ["--quick"]),
    ("hostile_requests.py", ["--quick"]),
    ("ray_pool.py", ["--quick"]),
    (
        "tree_layout.py",
        ["--sessions", "1", "--steps", "4", "--context", "1000", "--forward-context", "300"],
    ),
    ("viewer_open.py", ["--turns", "16", "--context", "8192", "--repeats", "1"]),
    ("stream_calls.py", ["--sizes", "2000", "--repeat", "1"]),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smallest settings: a smoke run")
    args = parser.parse_args()
    failed = []
    for name, quick_args in BENCHES:
        argv = [sys.executable, str(HERE / name), *(quick_args if args.quick else [])]
        print(f"== {name} {' '.join(argv[2:])}".rstrip(), flush=True)
        start = time.perf_counter()
        code = subprocess.call(argv)
        print(f"== {name}: exit {code} after {time.perf_counter() - start:.1f} s\n", flush=True)
        if code:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
