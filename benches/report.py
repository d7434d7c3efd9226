"""A bench's printed table, kept also under `docs/performance/` with how it was measured.

Each line a bench prints through `Report.line` goes to stdout; `Report.write` (a bench's
`--write` flag) puts them in `docs/performance/<bench>.md` with the command, the machine, its
load, the date and the commit, so the documented numbers are the ones a run printed.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "performance"


def machine() -> str:
    """The CPU, core count and Python, and the load average when asked."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{platform.machine()}, {os.cpu_count()} cores (load average {load}), "
        f"{platform.python_implementation()} {platform.python_version()}"
    )


def commit() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "")


class Report:
    """Lines printed as they come, and kept for `write`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self.started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())

    def line(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def write(self, title: str) -> Path:
        """`docs/performance/<bench>.md`: the table and how it was measured."""
        DOCS.mkdir(parents=True, exist_ok=True)
        path = DOCS / f"{self.name}.md"
        argv = " ".join(sys.argv[1:])
        text = "\n".join(
            [
                f"# {title}",
                "",
                f"- command: `python benches/{self.name}.py{' ' + argv if argv else ''}`",
                f"- machine: {machine()}",
                f"- date: {self.started}",
                f"- commit: {commit()}",
                "",
                "```text",
                *self.lines,
                "```",
                "",
            ]
        )
        path.write_text(text)
        print(f"written to {path.relative_to(ROOT)}")
        return path
