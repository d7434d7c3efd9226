"""Echo restore, validated on the real code path: four configurations, one coding session.

A Claude-Code-style harness drives the adapter (scripted engine, Qwen3 vocabulary) through the
built-in session; read-only observers on the manager's merge decision and drift classification
count what happened. Rows 1 and 4 must agree; rows 2 and 3 show what is lost without restore
before render.

    python benches/echo_restore_table.py
"""

from __future__ import annotations

import asyncio
import logging
import platform
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.manager import TrajectoryManager
from tokentrail.pipeline import Restore
from tokentrail.server import Adapter, AdapterConfig, start_server
from tokentrail.sim import DEFAULT_WORKSPACE, Behaviour, HarnessSim, Workspace
from tokentrail.tokenizer import load_tokenizer

TASK = "Fix the spacing in calc.py, add util.py with mul(), and write NOTES.md."
TOOLS = ("Edit", "Write", "Bash")


@dataclass(frozen=True)
class Config:
    name: str
    rerender: bool
    restore: Restore


CONFIGS = (
    Config("byte-exact echo", rerender=False, restore=Restore.ON),
    Config("rewritten echo, no restore", rerender=True, restore=Restore.OFF),
    Config("restored in the tree only", rerender=True, restore=Restore.TREE_ONLY),
    Config("restore before render", rerender=True, restore=Restore.ON),
)


@dataclass
class Row:
    config: str
    generated: int
    trained: int
    turns: dict[str, tuple[int, int]]  # tool -> (trained turns, turns)
    merges: int
    drifts: dict[str, int] = field(default_factory=dict)


class Observed:
    """Read-only observers around a manager's merge decision and drift classification."""

    def __init__(self, manager: TrajectoryManager) -> None:
        self.merges = 0
        self.drifts: Counter[str] = Counter()
        merge = manager._merge_rewrite  # noqa: SLF001 - observing the real decision
        core = manager.core

        def observed_merge(session: Any, node: Any, messages: Any, keys: Any, i: int) -> Any:
            out = merge(session, node, messages, keys, i)
            self.merges += out[1] != i
            return out

        observer = self

        class ObservedStore:
            """A session's turn store whose linearization reports its drift decisions."""

            def __init__(self) -> None:
                self._store = core.TurnStore()

            def __getattr__(self, name: str) -> Any:
                return getattr(self._store, name)

            def linearize(self, *args: Any, **kwargs: Any) -> Any:
                result = self._store.linearize(*args, **kwargs)
                observer.drifts.update(d.kind for d in result.drifts)
                return result

        class ObservedCore:
            TurnStore = ObservedStore

            def __getattr__(_, name: str) -> Any:
                return getattr(core, name)

        manager._merge_rewrite = observed_merge  # type: ignore[method-assign]
        manager.core = ObservedCore()  # type: ignore[assignment]


async def measure(config: Config, tokenizer: Any) -> Row:
    # The upstream merge: what restore saves is what the merge would otherwise destroy.
    manager = TrajectoryManager(rewrite_policy="merge")
    observed = Observed(manager)
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer),
        tokenizer=tokenizer,
        manager=manager,
        config=AdapterConfig(restore=config.restore),
    )
    runner, url = await start_server(adapter)
    try:
        async with aiohttp.ClientSession() as http:
            sim = HarnessSim(
                url,
                "bench",
                behaviour=Behaviour(rerender_echoes=config.rerender),
                workspace=Workspace(dict(DEFAULT_WORKSPACE)),
            )
            await sim.run(TASK, http)
        trajectory = await adapter.finish_trajectory("bench")
    finally:
        await runner.cleanup()
    ledger = trajectory.ledger
    turns = {
        tool: (
            ledger.by_tool.get(tool, {}).get("turns_trained", 0),
            ledger.by_tool.get(tool, {}).get("turns", 0),
        )
        for tool in TOOLS
    }
    return Row(
        config.name,
        ledger.generated_tokens,
        ledger.trained_tokens,
        turns,
        observed.merges,
        dict(sorted(observed.drifts.items())),
    )


def validation_table() -> list[Row]:
    tokenizer = load_tokenizer()
    return [asyncio.run(measure(config, tokenizer)) for config in CONFIGS]


def format_table(rows: list[Row]) -> str:
    head = (
        f"{'configuration':<30}{'trained tokens':>16}"
        + "".join(f"{tool + ' trained':>15}" for tool in TOOLS)
        + f"{'merges':>8}  drift kinds"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.config:<30}{f'{r.trained}/{r.generated}':>16}"
            + "".join(f"{f'{a}/{b}':>15}" for a, b in (r.turns[t] for t in TOOLS))
            + f"{r.merges:>8}  {r.drifts or '-'}"
        )
    lines.append(
        f"machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, scripted engine, builtin:qwen3"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    # The per-session lost-signal warnings would interleave with the table.
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    print(format_table(validation_table()))
