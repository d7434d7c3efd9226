"""The adapter's Prometheus metrics, read back through the exposition parser, and the
lost-training-signal warning."""

from __future__ import annotations

import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokens import assistant, play, sampled, system, tool, user
from tokentrail import (
    DriftKind,
    DriftRecord,
    Fallback,
    Ledger,
    PolicyError,
    Stage,
    Trajectory,
    TrajectoryManager,
    TurnLedger,
)
from tokentrail.adapter.metrics import (
    LATENCY_BUCKETS,
    STAGES,
    Metrics,
    masked_tool_turn_warning,
    warn_if_masked,
)

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(metrics: Metrics) -> Series:
    payload, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    out: Series = {}
    for family in text_string_to_metric_families(payload.decode()):
        for s in family.samples:
            if not s.name.endswith("_created"):
                out[s.name, frozenset(s.labels.items())] = s.value
    return out


def value(series: Series, name: str, **labels: str) -> float:
    return series[name, frozenset(labels.items())]


def labelled(series: Series, name: str, label: str) -> dict[str, float]:
    """Every value of `name`, by the one label it has."""
    return {dict(k)[label]: v for (n, k), v in series.items() if n == name}


def turn(index: int, tools: list[str], generated: int, trained: int, **masked: int) -> TurnLedger:
    return TurnLedger(index, tools, generated, trained, masked)


def trajectory() -> Trajectory:
    """Four turns: one clean, one merged away, one realigned in part, one truncated."""
    ledger = Ledger(
        turns=[
            turn(1, ["Read"], 10, 10),
            turn(2, ["Edit"], 7, 0, merged_rewrite=7),
            turn(3, ["Edit", "Bash"], 12, 9, realigned=3),
            turn(4, [], 5, 3, truncated=2),
        ]
    )
    drifts = [
        DriftRecord(2, DriftKind.CLEAN, 40, 0),
        DriftRecord(3, DriftKind.REALIGN, 60, 3),
        DriftRecord(4, DriftKind.FORK, 80, 30),
        DriftRecord(5, DriftKind.CLEAN, 90, 0),
    ]
    return Trajectory(samples=[], ledger=ledger, drifts=drifts)


def test_session_finished_adds_the_ledger() -> None:
    m = Metrics()
    m.session_finished(trajectory())
    s = scrape(m)
    assert value(s, "tokentrail_generated_tokens_total") == 34
    assert value(s, "tokentrail_trained_tokens_total") == 22
    assert labelled(s, "tokentrail_masked_tokens_total", "reason") == {
        "excluded": 0,
        "merged_rewrite": 7,
        "realigned": 3,
        "truncated": 2,
        "superseded": 0,
        "client_disconnected": 0,
        "constrained": 0,
        "unaccounted": 0,
    }
    assert labelled(s, "tokentrail_drift_decisions_total", "kind") == {
        "clean": 2,
        "realign": 1,
        "fork": 1,
    }
    assert value(s, "tokentrail_forks_total") == 1
    assert value(s, "tokentrail_rewrite_merges_total") == 1
    assert value(s, "tokentrail_sessions_finished_total") == 1
    assert value(s, "tokentrail_sessions_dropped_total") == 0


def test_session_finished_accumulates() -> None:
    m = Metrics()
    m.session_finished(trajectory())
    m.session_finished(trajectory())
    m.session_dropped()
    s = scrape(m)
    assert value(s, "tokentrail_generated_tokens_total") == 68
    assert value(s, "tokentrail_masked_tokens_total", reason="merged_rewrite") == 14
    assert value(s, "tokentrail_forks_total") == 2
    assert value(s, "tokentrail_rewrite_merges_total") == 2
    assert value(s, "tokentrail_sessions_finished_total") == 2
    assert value(s, "tokentrail_sessions_dropped_total") == 1


def test_session_finished_counts_a_real_merged_rewrite() -> None:
    mgr = TrajectoryManager(rewrite_policy="merge")
    sys_, u1 = system("be brief"), user("fix it")
    a1 = assistant("look", ("Read", {"path": "a.py"}))
    play(mgr, "s", [sys_, u1], a1)
    rewritten = assistant("look (edited)", ("Read", {"path": "a.py"}))
    out2 = play(mgr, "s", [sys_, u1, rewritten, tool("ok")], assistant("done"))
    m = Metrics()
    m.session_finished(mgr.finish("s"))
    s = scrape(m)
    assert value(s, "tokentrail_generated_tokens_total") == len(sampled(a1)) + len(out2)
    assert value(s, "tokentrail_trained_tokens_total") == len(out2)
    assert value(s, "tokentrail_masked_tokens_total", reason="merged_rewrite") == len(sampled(a1))
    assert value(s, "tokentrail_rewrite_merges_total") == 1


def test_live_counters_and_gauges() -> None:
    m = Metrics()
    m.request_done("anthropic", 200)
    m.request_done("anthropic", 200)
    m.request_done("openai", 400)
    m.restored(["Edit", "Write"])
    m.restored(["Edit"])
    m.restored([])
    m.splice_fallback(Fallback.TAIL_MISMATCH)
    m.in_flight(1)
    m.in_flight(1)
    m.in_flight(-1)
    m.set_open_sessions(3)
    s = scrape(m)
    assert value(s, "tokentrail_requests_total", protocol="anthropic", status="200") == 2
    assert value(s, "tokentrail_requests_total", protocol="openai", status="400") == 1
    assert labelled(s, "tokentrail_echo_restores_total", "tool") == {"Edit": 2, "Write": 1}
    fallbacks = labelled(s, "tokentrail_splice_fallbacks_total", "reason")
    assert fallbacks == {f.value: int(f is Fallback.TAIL_MISMATCH) for f in Fallback}
    assert value(s, "tokentrail_requests_in_flight") == 1
    assert value(s, "tokentrail_open_sessions") == 3


def test_observe_turn_fills_stage_and_total_histograms() -> None:
    m = Metrics()
    m.observe_turn({Stage.TRANSLATE: 0.0002, Stage.ENGINE: 1.5, Stage.RECORD: 0.003})
    m.observe_turn({Stage.ENGINE: 70.0, Stage.RESPOND: 0.5})
    s = scrape(m)
    count = labelled(s, "tokentrail_stage_duration_seconds_count", "stage")
    assert count == {
        stage: {"translate": 1, "engine": 2, "record": 1, "respond": 1}.get(stage, 0)
        for stage in STAGES
    }
    assert value(s, "tokentrail_stage_duration_seconds_sum", stage="engine") == 71.5
    # 0.2 ms lands in the 0.25 ms bucket, not the 0.1 ms one; 70 s only in +Inf.
    assert value(s, "tokentrail_stage_duration_seconds_bucket", stage="translate", le="0.0001") == 0
    assert (
        value(s, "tokentrail_stage_duration_seconds_bucket", stage="translate", le="0.00025") == 1
    )
    assert value(s, "tokentrail_stage_duration_seconds_bucket", stage="engine", le="60.0") == 1
    assert value(s, "tokentrail_stage_duration_seconds_bucket", stage="engine", le="+Inf") == 2
    assert value(s, "tokentrail_request_duration_seconds_count") == 2
    assert value(s, "tokentrail_request_duration_seconds_sum") == pytest.approx(1.5032 + 70.5)
    les = {dict(k)["le"] for (n, k) in s if n == "tokentrail_request_duration_seconds_bucket"}
    assert les == {str(b) for b in LATENCY_BUCKETS} | {"+Inf"}


def test_two_instances_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.session_finished(trajectory())
    a.request_done("openai", 200)
    a.in_flight(2)
    s = scrape(b)
    assert value(s, "tokentrail_generated_tokens_total") == 0
    assert value(s, "tokentrail_sessions_finished_total") == 0
    assert labelled(s, "tokentrail_requests_total", "protocol") == {}
    assert value(s, "tokentrail_requests_in_flight") == 0
    assert value(scrape(a), "tokentrail_generated_tokens_total") == 34


def tool_session(lost: int, clean: int) -> Ledger:
    """`lost` Edit turns merged away, then `clean` fully trained Read turns."""
    turns = [turn(k, ["Edit"], 5, 0, merged_rewrite=5) for k in range(lost)]
    turns += [turn(lost + k, ["Read"], 5, 5) for k in range(clean)]
    return Ledger(turns=turns)


def test_warning_names_session_fraction_tools_and_reasons() -> None:
    ledger = Ledger(
        turns=[
            turn(1, ["Edit"], 8, 0, merged_rewrite=8),
            turn(2, ["Edit"], 8, 0, merged_rewrite=8),
            turn(3, ["Write", "Write"], 9, 6, realigned=3),
            turn(4, ["Bash", "Edit"], 9, 5, realigned=2, truncated=2),
            turn(5, [], 9, 0, truncated=9),  # no tool call: not counted
            *[turn(6 + k, ["Read"], 4, 4) for k in range(6)],
        ]
    )
    assert masked_tool_turn_warning("s1", ledger) == (
        "session s1: 4/10 tool-call turns (40.0%) lost training signal: "
        "Bash (realigned=1, truncated=1), Edit (merged_rewrite=2, realigned=1, truncated=1), "
        "Write (realigned=1)"
    )


def test_warning_threshold_is_strict() -> None:
    assert masked_tool_turn_warning("s", tool_session(1, 19)) is None  # 5.0%: not above
    line = masked_tool_turn_warning("s", tool_session(2, 18))
    assert line == (
        "session s: 2/20 tool-call turns (10.0%) lost training signal: Edit (merged_rewrite=2)"
    )
    assert masked_tool_turn_warning("s", tool_session(2, 18), threshold=0.1) is None
    assert masked_tool_turn_warning("s", tool_session(0, 5), threshold=0.0) is None


def test_a_forced_call_masked_by_its_policy_is_no_lost_signal() -> None:
    forced = Ledger(turns=[turn(1, ["Read"], 10, 0, constrained=10), turn(2, ["Read"], 8, 8)])
    assert masked_tool_turn_warning("s", forced) is None
    both = Ledger(turns=[turn(1, ["Read"], 10, 0, constrained=6, realigned=4)])
    assert masked_tool_turn_warning("s", both) == (
        "session s: 1/1 tool-call turns (100.0%) lost training signal: Read (realigned=1)"
    )


def test_no_tool_calls_no_warning() -> None:
    ledger = Ledger(turns=[turn(1, [], 5, 0, truncated=5)])
    assert masked_tool_turn_warning("s", ledger) is None
    assert masked_tool_turn_warning("s", Ledger()) is None


def test_threshold_out_of_range_is_refused() -> None:
    with pytest.raises(PolicyError):
        masked_tool_turn_warning("s", Ledger(), threshold=1.5)


def test_warn_if_masked_logs_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("tokentrail.test_metrics")
    with caplog.at_level(logging.DEBUG, logger=log.name):
        line = warn_if_masked(log, "s7", tool_session(3, 7), 0.05)
        assert warn_if_masked(log, "s8", tool_session(0, 7), 0.05) is None
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == line
    assert line == (
        "session s7: 3/10 tool-call turns (30.0%) lost training signal: Edit (merged_rewrite=3)"
    )
