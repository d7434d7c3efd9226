"""What every actor of a pool runs: one `ActorSpec`, sent to each node, built there.

A spec holds names and settings, never loaded objects: the tokenizer is loaded, the engine
created and the journal opened on the actor's own node, so a spec pickles small and means the
same on every node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tokentrail.adapter import Adapter
from tokentrail.adapter.config import AdapterConfig
from tokentrail.core.routing import IndexerShape, RoutingShape
from tokentrail.engines.base import Engine
from tokentrail.engines.registry import DEFAULT_TIMEOUT_S, create_engine, engine_names
from tokentrail.errors import EngineSpecError, JournalError
from tokentrail.kinds import (
    Backend,
    ConstrainedPolicy,
    DriftPolicy,
    RewritePolicy,
    SyncMode,
    parse_kind,
)
from tokentrail.storage.journal import Journal
from tokentrail.text.tokenizer import DEFAULT_SPEC, LoadedTokenizer, load_tokenizer
from tokentrail.trajectory.manager import TrajectoryManager

# Builds an engine on the actor's node from the tokenizer loaded there (cloudpickled by Ray).
EngineFactory = Callable[[LoadedTokenizer], Engine]


@dataclass(frozen=True)
class ActorSpec:
    """One adapter of a pool: its engine, vocabulary, adapter settings and journal mode.

    `engine` is an engine spec as `tokentrail serve --engine` takes it ("scripted",
    "sglang://10.0.0.5:30000", ...) or a callable that builds an `Engine` from the tokenizer.
    `host` is the address the HTTP adapter binds and advertises; None means the node's IP.
    """

    engine: str | EngineFactory = "scripted"
    tokenizer: str = DEFAULT_SPEC
    chat_template: str | None = None
    config: AdapterConfig = field(default_factory=AdapterConfig)
    fork_threshold_tokens: int = 1024
    drift_policy: DriftPolicy = DriftPolicy.MINIMAL
    rewrite_policy: RewritePolicy = RewritePolicy.FORK
    backend: Backend | None = None
    # The MoE routing / sparse-attention indexer shapes the store keeps (with
    # `config.routed_experts` / `config.indexer_topk` set to ask the engine for them).
    routing: RoutingShape | None = None
    indexer: IndexerShape | None = None
    # Train a superseded generation as a dead-end sample instead of masking it.
    train_superseded: bool = False
    # Train tokens sampled under a grammar (a forced tool call) or mask them (the default).
    train_constrained: ConstrainedPolicy = ConstrainedPolicy.MASK
    journal_sync: SyncMode | str = SyncMode.NORMAL
    host: str | None = None
    engine_timeout_s: float = DEFAULT_TIMEOUT_S

    def check(self) -> None:
        """Refuse, on the driver, what every actor would fail on: an engine spec no engine
        registers, a journal sync mode the journal does not know."""
        # The simulated model registers itself as an engine on import, as `serve` does.
        import tokentrail.sim  # noqa: F401

        if isinstance(self.engine, str):
            scheme = self.engine.partition(":")[0]
            if scheme not in engine_names():
                raise EngineSpecError(
                    f"unknown engine spec {self.engine!r}; known: {', '.join(engine_names())}"
                )
        elif not callable(self.engine):
            raise EngineSpecError("engine must be an engine spec or a callable(tokenizer)")
        parse_kind(SyncMode, self.journal_sync, "journal sync mode", JournalError)

    def build(self, journal_path: Path) -> Adapter:
        """The adapter this spec describes, over the journal at `journal_path` (recovering the
        unfinished sessions it holds)."""
        self.check()
        tokenizer = load_tokenizer(self.tokenizer)
        if callable(self.engine):
            engine = self.engine(tokenizer)
        else:
            engine = create_engine(self.engine, tokenizer, timeout=self.engine_timeout_s)
        manager = TrajectoryManager(
            fork_threshold_tokens=self.fork_threshold_tokens,
            drift_policy=self.drift_policy,
            rewrite_policy=self.rewrite_policy,
            backend=self.backend,
            routing=self.routing,
            indexer=self.indexer,
            train_superseded=self.train_superseded,
            train_constrained=self.train_constrained,
        )
        # Behind a pool, a session exists only once the pool opened it on this adapter.
        config = dataclasses.replace(self.config, open_sessions_only=True)
        return Adapter(
            engine=engine,
            tokenizer=tokenizer,
            chat_template=self.chat_template,
            manager=manager,
            config=config,
            journal=Journal(journal_path, sync=self.journal_sync),
        )


__all__ = ["ActorSpec", "EngineFactory"]
