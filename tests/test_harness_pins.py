"""`scripts/bump-harnesses` reads every pin of `support.harness_versions` and rewrites only the
versions it is given, leaving the kept releases alone (no registry is asked here)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

from support import harness_versions

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bump-harnesses"


def _script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("bump_harnesses", str(SCRIPT))
    spec = importlib.util.spec_from_loader("bump_harnesses", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_script_reads_every_pin_and_rewrites_only_the_moved_ones() -> None:
    bump = _script()
    text = bump.PINS.read_text("utf-8")
    pins = bump.latest_pins(text)
    assert pins == {name: tuple(pin) for name, pin in harness_versions.LATEST.items()}
    # Every harness it bumps has tests to rerun, and they exist.
    assert set(bump.TESTS) == set(pins)
    root = SCRIPT.parents[1]
    assert all((root / t).exists() for tests in bump.TESTS.values() for t in tests)
    moved = bump.rewrite(text, {"codex": "9.9.9"})
    assert bump.latest_pins(moved)["codex"][2] == "9.9.9"
    assert {n: p for n, p in bump.latest_pins(moved).items() if n != "codex"} == {
        n: p for n, p in pins.items() if n != "codex"
    }
    # The kept releases are outside what it rewrites.
    kept = harness_versions.KEPT["claude-code"].version
    assert moved.count(f'"{kept}"') == text.count(f'"{kept}"') == 1
