"""What a bench prints about the machine it ran on, and its printed lines.

A bench's table reaches the docs through `benches/run_all.py`, which keeps what the bench
printed with the command, the machine, the date and the commit (`docs/benchmarks/`).
"""

from __future__ import annotations

import os
import platform


def machine() -> str:
    """The CPU, core count and Python, and the load average when asked."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{platform.machine()}, {os.cpu_count()} cores (load average {load}), "
        f"{platform.python_implementation()} {platform.python_version()}"
    )


class Report:
    """Lines printed as they come, and kept."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: list[str] = []

    def line(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)
