"""Pool-wide metrics: every actor's Prometheus series summed, the pool's own account of the
sessions it delivered, and one endpoint that serves both.

Counters and histograms add up across actors (buckets are the same everywhere); gauges add up
too (requests in flight, open sessions). An actor's counters start again from zero when Ray
restarts it, as any process's do; the `tokentrail_pool_*` token counters are the pool's own sum
of the ledgers it delivered, so they survive restarts and count each finished session once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tokentrail.trajectory.ledger import Ledger


@dataclass
class LedgerTotals:
    """The sum of the ledgers of every session a pool delivered."""

    sessions: int = 0
    turns: int = 0
    generated_tokens: int = 0
    trained_tokens: int = 0
    masked_tokens: dict[str, int] = field(default_factory=dict)
    restored_echoes: int = 0

    def add(self, ledger: Ledger) -> None:
        self.sessions += 1
        self.turns += len(ledger.turns)
        self.generated_tokens += ledger.generated_tokens
        self.trained_tokens += ledger.trained_tokens
        for reason, n in ledger.masked_tokens.items():
            self.masked_tokens[reason] = self.masked_tokens.get(reason, 0) + n
        self.restored_echoes += ledger.restored_echoes


def summed(per_actor: Iterable[list[Metric]]) -> list[Metric]:
    """One family per name: each sample (name and labels) added up over the actors; a
    `_created` timestamp takes the earliest."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for metrics in per_actor:
        for family in metrics:
            if family.name not in families:
                families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
                values[family.name] = {}
            acc = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in acc:
                    acc[key] = sample.value
                elif sample.name.endswith("_created"):
                    acc[key] = min(acc[key], sample.value)
                else:
                    acc[key] += sample.value
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    return list(families.values())


@dataclass
class PoolCounts:
    """What the pool itself knows, for its own series."""

    actors_alive: int
    actors_dead: int
    restarts: int
    sessions_open: int
    lost: dict[str, int]
    totals: LedgerTotals


def pool_series(counts: PoolCounts) -> list[Metric]:
    actors = GaugeMetricFamily(
        "tokentrail_pool_actors", "Adapter actors of the pool, by state.", labels=["state"]
    )
    actors.add_metric(["alive"], counts.actors_alive)
    actors.add_metric(["dead"], counts.actors_dead)
    restarts = CounterMetricFamily(
        "tokentrail_pool_actor_restarts", "Times Ray restarted one of the pool's actors."
    )
    restarts.add_metric([], counts.restarts)
    open_sessions = GaugeMetricFamily(
        "tokentrail_pool_open_sessions", "Sessions the pool placed and has not finished yet."
    )
    open_sessions.add_metric([], counts.sessions_open)
    lost = CounterMetricFamily(
        "tokentrail_pool_sessions_lost",
        "Sessions whose samples the pool could not deliver, by reason.",
        labels=["reason"],
    )
    for reason, n in sorted(counts.lost.items()):
        lost.add_metric([reason], n)
    t = counts.totals
    finished = CounterMetricFamily(
        "tokentrail_pool_sessions_finished", "Sessions the pool delivered as samples."
    )
    finished.add_metric([], t.sessions)
    generated = CounterMetricFamily(
        "tokentrail_pool_generated_tokens", "Generated tokens of the sessions the pool delivered."
    )
    generated.add_metric([], t.generated_tokens)
    trained = CounterMetricFamily(
        "tokentrail_pool_trained_tokens", "Of those, the tokens some sample trains on."
    )
    trained.add_metric([], t.trained_tokens)
    masked = CounterMetricFamily(
        "tokentrail_pool_masked_tokens",
        "Of those, the tokens masked out of training, by reason.",
        labels=["reason"],
    )
    for reason, n in sorted(t.masked_tokens.items()):
        masked.add_metric([reason], n)
    return [actors, restarts, open_sessions, lost, finished, generated, trained, masked]


class _Scrape(Collector):
    def __init__(self, collect: Callable[[], list[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[Metric]:
        yield from self._collect()


def serve(collect: Callable[[], list[Metric]], port: int = 0, addr: str = "127.0.0.1") -> Any:
    """Serve `collect()`'s families on `http://addr:port/metrics`, each scrape calling it
    anew; returns the server (its `server_port` is the bound port, `shutdown()` stops it)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Scrape(collect))
    server, _thread = start_http_server(port, addr, registry=registry)
    return server


__all__ = ["LedgerTotals", "PoolCounts", "pool_series", "serve", "summed"]
