"""Run every benchmark in this folder, one after another, each printing its own table.

    python benches/run_all.py [--quick] [--only NAME ...] [--out DIR]

`--quick` passes each bench its smallest setting (a smoke run that checks they all work);
without it each runs the setting the docs' tables show: its defaults, or the arguments
`FULL` names for it (a size that finishes in a few minutes on 2 shared cores). The Criterion
bench of the Rust core runs with `cargo bench --bench core`.

A full run writes each bench's output to `docs/benchmarks/NAME.md`, with the command, the
machine, the date and the commit, which the docs pages include: a number in the docs is the
output of a named run. A `--quick` run writes nothing unless `--out` names a folder.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
DOCS = HERE.parent / "docs" / "benchmarks"

# Each bench and the arguments of its smallest run.
BENCHES: list[tuple[str, list[str]]] = [
    ("echo_restore_table.py", []),
    ("harness_behaviours.py", ["--sessions", "1", "--steps", "4"]),
    ("splice_vs_render.py", ["--sessions", "1", "--steps", "4"]),
    ("length_cut.py", ["--max-tokens", "24"]),
    ("journal_durability.py", ["--turns", "10", "--contexts", "16000"]),
    ("journal_damage.py", []),
    ("journal_recovery.py", ["--gb", "0.02", "--path", "/tmp/tokentrail-recovery-quick.db"]),
    ("kill_sweep.py", ["--turns", "1", "--quick"]),
    ("checkpoint_kills.py", ["--sessions", "2", "--turns", "12", "--kills", "4"]),
    ("adapter_load.py", ["--sessions", "2", "--turns", "8", "--rounds", "1"]),
    ("session_scaling.py", ["--quick"]),
    ("journal_cost.py", ["--turns", "8", "--contexts", "8192", "--repeats", "1"]),
    ("turn_cost.py", ["--contexts", "4096,8192"]),
    ("against_slime.py", []),
    ("encode_speed.py", ["--vocabularies", "qwen3", "--full-tokens", "4000", "--repeats", "20"]),
    ("routing_replay.py", ["--sessions", "1", "--steps", "4"]),
    ("engine_answers.py", ["--tokens", "8192"]),
    ("replay_memory.py", ["--sessions", "3", "--tokens", "16384", "--budget-mib", "8"]),
    ("finish_binary.py", ["--tokens", "8000"]),
    ("image_memory.py", ["--sessions", "2", "--image-mb", "2"]),
    ("families.py", ["--sessions", "1", "--steps", "3", "--messages", "50"]),
    ("loop_responsiveness.py", ["--quick"]),
    (
        "loop_responsiveness.py:images",
        ["--rounds", "1", "--clients", "4", "--hold-s", "2", "--stream-words", "5000"],
    ),
    ("hostile_requests.py", ["--quick"]),
    ("ray_pool.py", ["--quick"]),
    (
        "tree_layout.py",
        ["--sessions", "1", "--steps", "4", "--context", "1000", "--forward-context", "300"],
    ),
    ("viewer_open.py", ["--turns", "16", "--context", "8192", "--repeats", "1"]),
    ("stream_calls.py", ["--sizes", "2000", "--repeat", "1"]),
    ("journal_images.py", ["--turns", "4"]),
    ("real_model.py", ["--models", "qwen3", "--context", "4000"]),
    ("streaming.py:first_byte", ["--turns", "10"]),
    ("streaming.py:cpu", ["--lengths", "500", "--cpu-turns", "2", "--rounds", "2"]),
    (
        "keepalive_stall.py",
        ["--stall", "12", "--idle", "10", "--keepalive", "2", "--control-keepalive", "40"],
    ),
]

# A bench that prints another table with other arguments is registered again as
# `NAME:VARIANT`, run with these arguments first; its output goes to `NAME-VARIANT.md`.
VARIANTS: dict[str, list[str]] = {
    "loop_responsiveness.py:images": ["--images"],
    "streaming.py:first_byte": ["--first-byte-only"],
    "streaming.py:cpu": ["--cpu-only"],
}

# The arguments of a full run (the docs' tables), where they are not the bench's defaults.
FULL: dict[str, list[str]] = {
    "journal_recovery.py": ["--gb", "0.25"],
    "kill_sweep.py": ["--turns", "1"],
    "real_model.py": ["--models", "qwen3,qwen3-moe"],
    "image_memory.py": ["--sessions", "52"],
}


def load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def machine(load: float | None = None) -> str:
    """The machine a run was measured on, in one line; `load`: the load average as the run
    started (default: now)."""
    load = load_average() if load is None else load
    return (
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}, "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"load average {load:.1f} at the start"
    )


def commit() -> str:
    """The commit measured, `+dirty` when the tree had changes (the data files this run or
    an earlier one wrote under `docs/benchmarks/` aside: they change nothing measured)."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True)
        return out.stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    changed = git(
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ":(top)",
        ":(top,exclude)docs/benchmarks",
    )
    return head + ("+dirty" if changed else "")


def data_file(
    name: str,
    args: list[str],
    output: str,
    code: int,
    seconds: float,
    measured: str = "",
    load: float | None = None,
) -> str:
    """A bench's output as the Markdown a docs page includes (pymdownx.snippets); `measured`
    and `load`: the commit and the load average as the run started (default: now)."""
    command = " ".join(["python", f"benches/{script(name)}", *args])
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    fence = "````" if "```" in output else "```"
    return (
        f"<!-- Written by benches/run_all.py; do not edit: run it again. -->\n"
        f"`{command}`: exit {code} after {seconds:.1f} s, {when}, commit `{measured or commit()}`, "
        f"on {machine(load)}.\n\n{fence}text\n{output.rstrip()}\n{fence}\n"
    )


def script(name: str) -> str:
    """The file a registered bench runs (`NAME:VARIANT` runs NAME)."""
    return name.partition(":")[0]


def output_name(name: str) -> str:
    """The data file a registered bench's output goes to."""
    return name.replace(".py", "").replace(":", "-") + ".md"


def run(name: str, args: list[str]) -> tuple[int, str, float]:
    """Run one bench, its output shown as it comes and kept."""
    argv = [sys.executable, str(HERE / script(name)), *args]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    return proc.wait(), "".join(lines), time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smallest settings: a smoke run")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these benches (file names)")
    parser.add_argument(
        "--out", type=Path, help="write each bench's output here (default: docs/benchmarks, "
        "for a full run; nowhere for --quick)",
    )  # fmt: skip
    args = parser.parse_args()
    known = {name for name, _ in BENCHES}
    unknown = sorted(set(args.only or ()) - known)
    if unknown:
        parser.error(f"unknown bench {', '.join(unknown)}; one of {', '.join(sorted(known))}")
    out = args.out if args.out is not None else (None if args.quick else DOCS)
    failed = []
    for name, quick_args in BENCHES:
        if args.only and name not in args.only:
            continue
        bench_args = VARIANTS.get(name, []) + (quick_args if args.quick else FULL.get(name, []))
        print(f"== {name} {' '.join(bench_args)}".rstrip(), flush=True)
        measured, load = commit(), load_average()
        code, output, seconds = run(name, bench_args)
        print(f"== {name}: exit {code} after {seconds:.1f} s\n", flush=True)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            page = data_file(name, bench_args, output, code, seconds, measured, load)
            (out / output_name(name)).write_text(page, "utf-8")
        if code:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
