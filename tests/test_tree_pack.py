"""Groups end to end: sessions opened with one group id over a journaled adapter (one of them
across a restart), exported from the journal, packed with `tokentrail pack` into one tree per
group, and read back."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.adapter.config import SessionSettings
from tokentrail.cli import main
from tokentrail.errors import SessionError, TreeError
from tokentrail.sim.harness import CLAUDE_CODE_TOOLS, SYSTEM_PROMPT, SessionSpec
from tokentrail.sim.model import SimulatedEngine
from tokentrail.storage.export import read_samples
from tokentrail.storage.journal import Journal
from tokentrail.storage.tree_pack import pack_tree, read_tree_pack
from tokentrail.trajectory.sample import Sample

ADMIN = "tree-admin"
SYSTEM = f"{SYSTEM_PROMPT}\n{SessionSpec(seed=3, steps=3).plan(agent=False).marker()}"
BODY = {
    "model": "m",
    "max_tokens": 512,
    "system": SYSTEM,
    "messages": [{"role": "user", "content": "Refactor the modules."}],
    "tools": CLAUDE_CODE_TOOLS,
}


def adapter_for(tokenizer, journal: Journal, seed: int) -> Adapter:
    return Adapter(
        engine=SimulatedEngine(tokenizer, seed=seed),
        tokenizer=tokenizer,
        config=AdapterConfig(admin_token=ADMIN),
        journal=journal,
    )


async def send(url: str, sid: str) -> int:
    headers = {"x-api-key": sid, "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/messages", data=json.dumps(BODY), headers=headers) as r:
            await r.read()
            return r.status


async def finish(url: str, sid: str, reward: float) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}/tokentrail/sessions/{sid}/finish",
            json={"reward": reward},
            headers={"Authorization": f"Bearer {ADMIN}"},
        ) as resp:
            assert resp.status == 200
            return await resp.json()


def serve(adapter: Adapter, body):
    async def go():
        runner, url = await start_server(adapter)
        try:
            return await body(url)
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_a_journaled_group_packs_into_one_tree(tokenizer, tmp_path: Path, capsys) -> None:
    path = tmp_path / "run.db"
    first = adapter_for(tokenizer, Journal(path), seed=1)
    for k in range(3):
        first.open_session(f"r{k}", SessionSettings(group="task-7"))
    first.open_session("solo")

    async def turns(url: str) -> list[int]:
        return [await send(url, sid) for sid in ("r0", "r1", "r2", "solo")]

    assert serve(first, turns) == [200] * 4
    first.journal.close()
    # The group is in the journal: a restarted adapter still knows it.
    second = adapter_for(tokenizer, Journal(path), seed=1)

    async def finish_all(url: str) -> list[dict[str, Any]]:
        return [await finish(url, sid, float(k)) for k, sid in enumerate(("r0", "r1", "r2"))] + [
            await finish(url, "solo", 0.0)
        ]

    done = serve(second, finish_all)
    second.journal.close()
    for answer, group in zip(done, ["task-7"] * 3 + [None], strict=True):
        assert {s["metadata"].get("group") for s in answer["samples"]} == {group}
        # One linear conversation each: nothing shared inside a session.
        layout = answer["ledger"]["layout"]
        assert layout["rows"] == 1 and layout["saved_tokens"] == 0

    samples_file, tree_file = tmp_path / "done.npz", tmp_path / "tree.npz"
    assert main(["journal", "export", str(path), str(samples_file)]) == 0
    assert main(["pack", str(samples_file), "--out", str(tree_file)]) == 0
    printed = capsys.readouterr().out
    assert "task-7" in printed and "session:solo" in printed

    samples = read_samples(samples_file)
    packed = read_tree_pack(tree_file)
    assert list(packed.trees) == ["task-7", "session:solo"]
    tree = packed.trees["task-7"]
    rows = [s for s in samples if s.metadata.get("group") == "task-7"]
    assert tree.num_rows == 3
    # The three rollouts share the prompt (the same request) and differ in what they sampled.
    prompt = rows[0].prompt_length
    assert all(s.prompt_length == prompt for s in rows)
    assert tree.stats.tree_tokens <= tree.stats.row_tokens - 2 * prompt
    assert tree.block_parent[0] == -1 and tree.block_offsets[1] >= prompt
    for r, s in enumerate(rows):
        assert np.array_equal(tree.tokens[tree.row_path(r)], s.tokens)
    assert tree.rewards.tolist() == [0.0, 1.0, 2.0]
    # `--json` prints the same figures the trees have.
    assert main(["pack", str(samples_file), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["groups"]["task-7"] == tree.stats.to_dict()
    assert stats["total"]["row_tokens"] == sum(len(s.tokens) for s in samples)


def test_bad_groups_are_refused(tokenizer, tmp_path: Path, capsys) -> None:
    adapter = adapter_for(tokenizer, Journal(tmp_path / "j.db"), seed=0)
    with pytest.raises(SessionError, match="group must be a non-empty string"):
        adapter.open_session("a", SessionSettings(group=""))
    adapter.journal.close()
    one = Sample(
        tokens=np.array([1, 2, 3], dtype=np.uint32),
        loss_mask=np.ones(1, dtype=np.uint8),
        rollout_log_probs=np.zeros(1, dtype=np.float32),
        response_length=1,
        metadata={"session_id": "s", "group": "g1"},
    )
    other = Sample(**{**one.__dict__, "metadata": {"session_id": "s", "group": "g2"}})
    with pytest.raises(TreeError, match="session 's' has samples in groups 'g1' and 'g2'"):
        pack_tree([one, other])
    bad = tmp_path / "not-samples.npz"
    bad.write_bytes(b"nothing")
    assert main(["pack", str(bad)]) == 1
    assert "not a tokentrail .npz sample file" in capsys.readouterr().out
    with pytest.raises(TreeError, match="not a tokentrail tree pack"):
        read_tree_pack(bad)
