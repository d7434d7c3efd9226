"""The adapter's Prometheus metrics, and the warning a trainer reads when tool-call turns lose
their training signal. Each adapter owns one `CollectorRegistry`, so several adapters in one
process (or one test run) never share or collide on a series.
"""

from __future__ import annotations

import logging
from collections import Counter as _Tally
from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from tokentrail.errors import PolicyError
from tokentrail.kinds import DriftKind, EngineFault, Fallback, MaskReason, ResumeCheck, Stage

if TYPE_CHECKING:
    from tokentrail.trajectory.ledger import Ledger
    from tokentrail.trajectory.linearize import Trajectory

__all__ = [
    "DRIFT_KINDS",
    "LATENCY_BUCKETS",
    "MASK_REASONS",
    "STAGES",
    "Metrics",
    "masked_tool_turn_warning",
    "replay_warning",
    "warn_if_masked",
]

# The pipeline stages of one turn, in order; `TurnTiming.lap` names.
STAGES = tuple(s.value for s in Stage)
DRIFT_KINDS = tuple(k.value for k in DriftKind)
# `stale` is a trainer's decision after finish (`trajectory.staleness`), never the adapter's.
MASK_REASONS = tuple(r.value for r in MaskReason if r is not MaskReason.STALE)
# How a retried request was answered.
RETRY_ANSWERS = ("recorded", "generated")
# 0.1 ms (a cache hit in `restore`) up to 60 s (a long generation in `engine`).
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class Metrics:
    """Every series the adapter exports, in a registry of its own.

    Live events (requests, echo restores, splice fallbacks) are counted as they happen, so a
    dropped session still shows in them; token and drift counts exist only once a session is
    linearized and are added by `session_finished`.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.generated_tokens = Counter(
            "tokentrail_generated_tokens_total",
            "Tokens the engine generated, counted when their session finishes.",
            registry=r,
        )
        self.trained_tokens = Counter(
            "tokentrail_trained_tokens_total",
            "Generated tokens some training sample trains on.",
            registry=r,
        )
        self.masked_tokens = Counter(
            "tokentrail_masked_tokens_total",
            "Generated tokens masked out of training, by the reason that removed them.",
            ["reason"],
            registry=r,
        )
        self.echo_restores = Counter(
            "tokentrail_echo_restores_total",
            "Harness echoes replaced by the generated message they came from, by tool.",
            ["tool"],
            registry=r,
        )
        self.drift_decisions = Counter(
            "tokentrail_drift_decisions_total",
            "Drift decisions taken while linearizing, by kind.",
            ["kind"],
            registry=r,
        )
        self.forks = Counter(
            "tokentrail_forks_total",
            "Drift decisions that started a new sample (drift kind fork).",
            registry=r,
        )
        self.rewrite_merges = Counter(
            "tokentrail_rewrite_merges_total",
            "Generated turns a harness rewrite merged away (masked as merged_rewrite).",
            registry=r,
        )
        self.dropped_media_total = Counter(
            "tokentrail_dropped_media_total",
            "Images, documents and other media rendered as a placeholder, by kind, per request.",
            ["kind"],
            registry=r,
        )
        self.replay_tokens = Counter(
            "tokentrail_replay_tokens_total",
            "Sample tokens with their replay row (status present) or without it, by the reason, "
            "per replay channel (routed_experts, indexer_topk).",
            ["channel", "status"],
            registry=r,
        )
        self.splice_fallbacks = Counter(
            "tokentrail_splice_fallbacks_total",
            "Turns whose prompt ids were re-rendered instead of spliced, by reason.",
            ["reason"],
            registry=r,
        )
        self.requests = Counter(
            "tokentrail_requests_total",
            "HTTP requests answered, by protocol and status code.",
            ["protocol", "status"],
            registry=r,
        )
        self.sessions_finished = Counter(
            "tokentrail_sessions_finished_total",
            "Sessions linearized into training samples.",
            registry=r,
        )
        self.sessions_dropped = Counter(
            "tokentrail_sessions_dropped_total",
            "Sessions dropped without producing samples.",
            registry=r,
        )
        self.sessions_evicted = Counter(
            "tokentrail_sessions_evicted_total",
            "Sessions evicted idle past the TTL; their turns were not linearized.",
            registry=r,
        )
        self.sessions_damaged = Counter(
            "tokentrail_sessions_damaged_total",
            "Sessions finished that had lost journaled turns (a crash, a damaged journal).",
            registry=r,
        )
        self.lost_turns = Counter(
            "tokentrail_lost_turns_total",
            "Journaled turns of finished sessions that were lost before linearization.",
            registry=r,
        )
        self.engine_errors = Counter(
            "tokentrail_engine_errors_total",
            "Engine calls that failed or whose output was refused, by fault.",
            ["fault"],
            registry=r,
        )
        self.open_connections = Gauge(
            "tokentrail_open_connections",
            "HTTP connections open to the adapter.",
            registry=r,
        )
        self.stage_latency = Histogram(
            "tokentrail_stage_duration_seconds",
            "Seconds one turn spent in each pipeline stage.",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.request_latency = Histogram(
            "tokentrail_request_duration_seconds",
            "Seconds one turn spent in the adapter, all stages together.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "tokentrail_retries_total",
            "Retried requests (the prompt of a recorded turn nothing was built on), by how they "
            "were answered: from the record, or generated again (superseding the earlier turn).",
            ["answer"],
            registry=r,
        )
        self.client_disconnects = Counter(
            "tokentrail_client_disconnects_total",
            "Streamed turns whose harness went away mid-stream: the engine request was stopped "
            "and the tokens sampled until then recorded, masked as client_disconnected.",
            registry=r,
        )
        self.stream_mismatches = Counter(
            "tokentrail_stream_mismatches_total",
            "Replies streamed as sampled whose streamed text or tool calls turned out not to be "
            "a prefix of the whole parse (ill-formed output the whole parse rejects, or reads "
            "otherwise): what the harness saw differs from the recorded reply.",
            registry=r,
        )
        self.resume_checks = Counter(
            "tokentrail_resume_checks_total",
            "Requests translated both resumed and in full (serve --verify-resume), by whether "
            "the two were the same.",
            ["result"],
            registry=r,
        )
        self.unknown_field_values = Counter(
            "tokentrail_unknown_field_values_total",
            "Requests that sent a value this adapter does not know in a field that does not "
            "change what is generated (a display preference, a context-management hint): "
            "accepted, not refused; a harness's new release sends one.",
            ["field"],
            registry=r,
        )
        self.in_flight_requests = Gauge(
            "tokentrail_requests_in_flight",
            "Requests the adapter is serving now.",
            registry=r,
        )
        self.open_sessions = Gauge(
            "tokentrail_open_sessions",
            "Sessions recorded and not yet finished or dropped.",
            registry=r,
        )
        self.replay_rows = Gauge(
            "tokentrail_replay_rows_bytes",
            "Open sessions' replay rows, on the heap or in files past the memory budget.",
            ["held"],
            registry=r,
        )
        # Closed label sets start at zero, so `rate()` sees the first increment.
        for stage in STAGES:
            self.stage_latency.labels(stage=stage)
        for kind in DRIFT_KINDS:
            self.drift_decisions.labels(kind=kind)
        for reason in MASK_REASONS:
            self.masked_tokens.labels(reason=reason)
        for fallback in Fallback:
            self.splice_fallbacks.labels(reason=fallback.value)
        for fault in EngineFault:
            self.engine_errors.labels(fault=fault.value)
        for answer in RETRY_ANSWERS:
            self.retries.labels(answer=answer)
        for check in ResumeCheck:
            self.resume_checks.labels(result=check.value)

    # -- per request ----------------------------------------------------------------------------

    def observe_turn(self, stages: Mapping[Stage, float]) -> None:
        """Observe one turn's seconds per stage, and their sum as the turn's latency."""
        for stage, value in stages.items():
            self.stage_latency.labels(stage=stage.value).observe(value)
        self.request_latency.observe(sum(stages.values()))

    def request_done(self, protocol: str, status: int) -> None:
        self.requests.labels(protocol=protocol, status=str(status)).inc()

    def in_flight(self, delta: int) -> None:
        self.in_flight_requests.inc(delta)

    def set_open_sessions(self, n: int) -> None:
        self.open_sessions.set(n)

    def restored(self, tool_names: list[str]) -> None:
        """Count one restored echo per tool name (a message with two calls restores both)."""
        for tool in tool_names:
            self.echo_restores.labels(tool=tool).inc()

    def dropped_media(self, counts: Mapping[str, int]) -> None:
        """Count the media a request's translation replaced with a placeholder."""
        for kind, n in counts.items():
            self.dropped_media_total.labels(kind=kind).inc(n)

    def retried(self, *, recorded: bool) -> None:
        self.retries.labels(answer=RETRY_ANSWERS[0] if recorded else RETRY_ANSWERS[1]).inc()

    def client_disconnected(self) -> None:
        self.client_disconnects.inc()

    def stream_mismatched(self) -> None:
        self.stream_mismatches.inc()

    def resume_checked(self, result: ResumeCheck) -> None:
        self.resume_checks.labels(result=result.value).inc()

    def unknown_values(self, fields: list[str]) -> None:
        """Count the fields whose values a request's check accepted without knowing them."""
        for name in fields:
            self.unknown_field_values.labels(field=name).inc()

    def splice_fallback(self, reason: Fallback) -> None:
        self.splice_fallbacks.labels(reason=reason.value).inc()

    # -- per session ----------------------------------------------------------------------------

    def session_finished(self, trajectory: Trajectory) -> None:
        """Add a finished session's ledger and drift decisions.

        Merges are the ledger's turns masked as `merged_rewrite`. Restores and splice
        fallbacks are not taken from the ledger: they were counted live.
        """
        ledger = trajectory.ledger
        self.generated_tokens.inc(ledger.generated_tokens)
        self.trained_tokens.inc(ledger.trained_tokens)
        for reason, n in ledger.masked_tokens.items():
            self.masked_tokens.labels(reason=reason).inc(n)
        drifts = trajectory.drift_counts
        for kind, n in drifts.items():
            self.drift_decisions.labels(kind=kind).inc(n)
        self.forks.inc(drifts.get(DriftKind.FORK.value, 0))
        merged = MaskReason.MERGED_REWRITE.value
        self.rewrite_merges.inc(sum(1 for t in ledger.turns if t.masked.get(merged, 0) > 0))
        for channel, coverage in ledger.replay.items():
            self.replay_tokens.labels(channel=channel, status="present").inc(coverage.present)
            for reason, n in coverage.missing.items():
                self.replay_tokens.labels(channel=channel, status=reason).inc(n)
        self.sessions_finished.inc()
        if ledger.lost:
            self.sessions_damaged.inc()
            self.lost_turns.inc(max(ledger.lost_turns, 0))

    def session_dropped(self) -> None:
        self.sessions_dropped.inc()

    def session_evicted(self) -> None:
        self.sessions_evicted.inc()

    def engine_error(self, fault: str) -> None:
        self.engine_errors.labels(fault=fault).inc()

    def set_replay_rows(self, heap: int, files: int) -> None:
        self.replay_rows.labels(held="heap").set(heap)
        self.replay_rows.labels(held="file").set(files)

    def set_open_connections(self, n: int) -> None:
        self.open_connections.set(n)

    def render(self) -> tuple[bytes, str]:
        """The exposition payload and its content type, for a `/metrics` handler."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def masked_tool_turn_warning(sid: str, ledger: Ledger, threshold: float = 0.05) -> str | None:
    """One line when more than `threshold` of a session's tool-call turns lost any token.

    The line names the session, the fraction, and per tool the number of turns masked by each
    reason; a turn masked for two reasons counts under both. None when the fraction is at or
    below the threshold, or the session made no tool calls (superseded turns do not count).
    """
    if not 0.0 <= threshold <= 1.0:
        raise PolicyError(f"threshold must be in [0, 1], got {threshold}")
    # A superseded turn is a dead end the harness discarded, not lost signal; tokens masked
    # `constrained` (a forced call) were masked by the policy the trainer chose.
    tool_turns = [t for t in ledger.turns if t.tools and not t.superseded]
    chosen = MaskReason.CONSTRAINED.value
    lost = [t for t in tool_turns if any(n > 0 for r, n in t.masked.items() if r != chosen)]
    if not tool_turns or len(lost) / len(tool_turns) <= threshold:
        return None
    by_tool: dict[str, _Tally[str]] = {}
    for t in lost:
        for tool in dict.fromkeys(t.tools):
            tally = by_tool.setdefault(tool, _Tally())
            tally.update(reason for reason, n in t.masked.items() if n > 0 and reason != chosen)
    parts = [
        f"{tool} ({', '.join(f'{r}={n}' for r, n in sorted(by_tool[tool].items()))})"
        for tool in sorted(by_tool)
    ]
    fraction = len(lost) / len(tool_turns)
    return (
        f"session {sid}: {len(lost)}/{len(tool_turns)} tool-call turns ({fraction:.1%}) "
        f"lost training signal: {', '.join(parts)}"
    )


def replay_warning(sid: str, ledger: Ledger) -> str | None:
    """One line when a session's samples lack replay rows: a MoE trainer replaying them would
    not compute the function sampling did. None when every kept channel is complete."""
    parts = [
        f"{channel} {c.present}/{c.tokens} tokens "
        f"({', '.join(f'{r}={n}' for r, n in sorted(c.missing.items()))})"
        for channel, c in ledger.replay.items()
        if not c.complete
    ]
    return f"session {sid}: replay rows missing: {'; '.join(parts)}" if parts else None


def warn_if_masked(
    logger: logging.Logger, sid: str, ledger: Ledger, threshold: float = 0.05
) -> str | None:
    """Log `masked_tool_turn_warning` at WARNING, if there is one; call once per finished
    session. Returns the line logged."""
    line = masked_tool_turn_warning(sid, ledger, threshold)
    if line is not None:
        logger.warning("%s", line)
    return line
