"""The benchmark tables the docs include are bench output that `benches/run_all.py` wrote,
each naming its command, machine, date and commit."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
HEADER = re.compile(
    r"^`python benches/(\w+\.py)[^`]*`: exit 0 after [\d.]+ s, \d{4}-\d\d-\d\d \d\d:\d\d UTC, "
    r"commit `[0-9a-f]{7,40}(\+dirty)?`, on .+ cores, .+\.$",
    re.M,
)


def _run_all():
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "benches" / "run_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_data_file_names_its_run() -> None:
    run_all = _run_all()
    page = run_all.data_file("echo_restore_table.py", [], "a | b\n1 | 2\n", 0, 8.25)
    assert HEADER.search(page), page
    measured = run_all.data_file("echo_restore_table.py", [], "x\n", 0, 1.0, "0123456789ab", 7.5)
    assert "commit `0123456789ab`" in measured and "load average 7.5 at the start" in measured
    assert "```text\na | b\n1 | 2\n```" in page


def _included() -> set[str]:
    """The data files the docs pages include."""
    return {
        m.group(1)
        for page in DOCS.rglob("*.md")
        for m in re.finditer(r'^--8<-- "benchmarks/([\w.-]+)"', page.read_text("utf-8"), re.M)
    }


def test_every_included_table_is_a_written_run() -> None:
    included = _included()
    assert included, "no page includes a generated table"
    run_all = _run_all()
    # Each data file a registered bench writes, and the file that bench runs.
    writes = {run_all.output_name(name): run_all.script(name) for name, _ in run_all.BENCHES}
    for name in included:
        text = (DOCS / "benchmarks" / name).read_text("utf-8")
        header = HEADER.search(text)
        assert header, f"docs/benchmarks/{name} does not name its run"
        assert writes.get(name) == header.group(1), (name, header.group(1))


def test_a_full_run_names_registered_benches() -> None:
    run_all = _run_all()
    benches = {name for name, _ in run_all.BENCHES}
    assert set(run_all.FULL) <= benches, sorted(set(run_all.FULL) - benches)
    assert set(run_all.VARIANTS) <= benches, sorted(set(run_all.VARIANTS) - benches)
    assert run_all.output_name("loop_responsiveness.py:images") == "loop_responsiveness-images.md"
    assert run_all.script("loop_responsiveness.py:images") == "loop_responsiveness.py"
    assert all(args and all(isinstance(a, str) for a in args) for args in run_all.FULL.values())


def test_every_written_table_is_included() -> None:
    """A data file no page includes is a table no reader sees; one no registered bench writes
    cannot be run again."""
    run_all = _run_all()
    written = {p.name for p in (DOCS / "benchmarks").glob("*.md")} - {"index.md"}
    assert written - _included() == set(), sorted(written - _included())
    registered = {run_all.output_name(name) for name, _ in run_all.BENCHES}
    assert written - registered == set(), sorted(written - registered)


# The README cannot include a data file (GitHub shows it as it is), so its one table of
# numbers is held to the runs' output here: each row, by its first cell, and the line of the
# data file whose numbers it shows.
README_ROWS = {
    "off (the re-rendered echo taken as sent)": (
        "echo_restore_table.md",
        "rewritten echo, no restore",
    ),
    "on (the default)": ("echo_restore_table.md", "restore before render"),
    "off, upstream `merge` policy": ("harness_behaviours.md", "merge, restore off"),
    "on": ("harness_behaviours.md", "merge, restore on"),
}


def test_the_readme_table_is_the_runs_output() -> None:
    rows = {}
    for line in (ROOT / "README.md").read_text("utf-8").splitlines():
        cells = [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] in README_ROWS:
            rows[cells[0]] = [c for c in cells[1:4] if c]
    assert set(rows) == set(README_ROWS), sorted(set(README_ROWS) - set(rows))
    for label, numbers in rows.items():
        name, run_row = README_ROWS[label]
        text = (DOCS / "benchmarks" / name).read_text("utf-8")
        found = [ln.split() for ln in text.splitlines() if ln.startswith(run_row)]
        assert found, f"docs/benchmarks/{name} has no row {run_row!r}"
        assert all(n in found[-1] for n in numbers), (label, numbers, found[-1])
