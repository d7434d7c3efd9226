"""Echo restore validated on the real adapter path: one scripted Claude-Code-style session
under four configurations (byte-exact echoes, rewritten echoes without restore, restored in the
tree only, restored before render), with what each trains, merges and drifts.

`benches/echo_restore_table.py` prints the table; the tests hold its rows to what they must be.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp

from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.kinds import MaskReason, Restore, RewritePolicy
from tokentrail.sim.harness import DEFAULT_WORKSPACE, Behaviour, HarnessSim, Workspace
from tokentrail.text.tokenizer import LoadedTokenizer
from tokentrail.trajectory.manager import TrajectoryManager

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


async def measure(config: Config, tokenizer: LoadedTokenizer) -> Row:
    """One session under `config`, with the upstream merge: what restore saves is what the
    merge would otherwise destroy."""
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer),
        tokenizer=tokenizer,
        manager=TrajectoryManager(rewrite_policy=RewritePolicy.MERGE),
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
    by_tool = ledger.by_tool
    turns = {
        tool: (by_tool.get(tool, {}).get("turns_trained", 0), by_tool.get(tool, {}).get("turns", 0))
        for tool in TOOLS
    }
    merges = sum(1 for t in ledger.turns if t.masked.get(MaskReason.MERGED_REWRITE, 0))
    return Row(
        config.name,
        ledger.generated_tokens,
        ledger.trained_tokens,
        turns,
        merges,
        dict(sorted(trajectory.drift_counts.items())),
    )


def validation_table(tokenizer: LoadedTokenizer) -> list[Row]:
    return [asyncio.run(measure(config, tokenizer)) for config in CONFIGS]
