"""The test run's peak memory, held to a budget.

A pytest plugin: a thread samples the memory of the pytest process and every process it started
(servers, harness CLIs, Ray workers, engines), summed, every 0.2 s. Each process counts its
proportional set size (PSS: a page shared by n processes counts 1/n in each), so the sum is what
the run holds of the machine's memory. The peak is printed at the end of the run, and a run
whose peak is over the budget fails, so a test that adds a real engine cannot push CI into the
OOM killer unnoticed.

`TOKENTRAIL_TEST_MEMORY_BUDGET_GB` sets the budget: by default 18 GB of CI's 24 GB machine, the
rest left to the kernel, the page cache and the processes the run did not start.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

DEFAULT_BUDGET_GB = 18.0
INTERVAL_S = 0.2
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: the fields follow its last ")".
        fields = stat[stat.rfind(")") + 2 :].split()
        tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def _pss(pid: int) -> int:
    """The process's proportional set size in bytes (its resident size where the kernel has no
    `smaps_rollup`), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def tree_pss(root: int) -> int:
    """The summed proportional set size of `root` and all its descendants, in bytes."""
    tree = _children()
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += _pss(pid)
        stack.extend(tree.get(pid, ()))
    return total


class MemoryBudget:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.peak_bytes = 0
        self.peak_test = ""
        self.current_test = "(collection)"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="memory-budget", daemon=True)

    def _sample(self) -> None:
        pid = os.getpid()
        while not self._stop.wait(INTERVAL_S):
            used = tree_pss(pid)
            if used > self.peak_bytes:
                self.peak_bytes, self.peak_test = used, self.current_test

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def over(self) -> bool:
        return self.peak_bytes > self.budget_bytes


_KEY = pytest.StashKey[MemoryBudget]()


def pytest_configure(config: pytest.Config) -> None:
    if not os.path.isdir("/proc"):
        return
    budget_gb = float(os.environ.get("TOKENTRAIL_TEST_MEMORY_BUDGET_GB", DEFAULT_BUDGET_GB))
    meter = MemoryBudget(int(budget_gb * 1e9))
    config.stash[_KEY] = meter
    meter.start()


def pytest_runtest_setup(item: pytest.Item) -> None:
    meter = item.config.stash.get(_KEY, None)
    if meter is not None:
        meter.current_test = item.nodeid


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    meter = session.config.stash.get(_KEY, None)
    if meter is None:
        return
    meter.stop()
    if meter.over and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    meter = config.stash.get(_KEY, None)
    if meter is None:
        return
    verdict = "OVER BUDGET" if meter.over else "within budget"
    terminalreporter.write_line(
        f"peak memory of the test run: {meter.peak_bytes / 1e9:.2f} GB "
        f"({verdict}: {meter.budget_bytes / 1e9:.2f} GB; "
        f"TOKENTRAIL_TEST_MEMORY_BUDGET_GB), during {meter.peak_test}",
        red=meter.over,
        bold=meter.over,
    )
