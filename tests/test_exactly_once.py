"""Exactly-once turns with a real `tokentrail serve --journal` that is SIGKILLed inside the
journal-write -> reply window, with a client that resends its request (a small version of
`benches/kill_sweep.py`, which sweeps the whole window); and one writer per journal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.retrying_client import compare, free_port, run_session, serve, stop
from tokentrail.sim.harness import SessionSpec

pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGKILL")

SPEC = SessionSpec(seed=11, steps=4, context_tokens=2000)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The uninterrupted run."""
    answer, _, crashed = run_session(tmp_path_factory.mktemp("clean"), SPEC, stream=True)
    assert not crashed and len(answer["ledger"]["turns"]) == 5
    return answer


@pytest.mark.parametrize(
    ("point", "turn", "answered"), [("journaled", 2, 1), ("write-1", 3, 1), ("flushed", 2, 0)]
)
def test_a_kill_between_journal_and_reply_is_answered_once(
    tmp_path: Path, clean: dict, point: str, turn: int, answered: int
) -> None:
    """Killed after the turn was journaled, before (or while) its reply was written: the
    client resends, the restarted server answers with the journaled reply. Killed after the
    whole reply was delivered: the client's next request reaches the restarted server, which
    carries the session on from its journal. Either way nothing is lost, and the finish says
    so."""
    answer, client, crashed = run_session(tmp_path, SPEC, stream=True, crash=(point, turn))
    assert crashed and client.retries >= 1
    expected = {"duplicated": 0, "lost": 0, "identical": 1, "answered": answered}
    assert compare(clean, answer) == expected
    assert answer["lost"] is None and answer["ledger"]["lost_turns"] == 0


def test_a_second_server_on_the_same_journal_exits_naming_the_first(tmp_path: Path) -> None:
    journal = tmp_path / "run.db"
    first = serve(journal, free_port())
    try:
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
            timeout=60,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
    finally:
        stop(first)
    assert second.returncode != 0
    assert f"in use by process {first.pid}" in second.stderr.decode()
