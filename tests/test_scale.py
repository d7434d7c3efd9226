"""Scale-out on Ray: adapter actors on a local multi-node cluster, sessions through the real HTTP
path, samples through the object store, failover from the journal.

One local cluster for the module (Ray's own `ray.cluster_utils.Cluster`: the head node, where
the driver runs, and a second node, both offering the `tokentrail` resource), so the actors
really sit on different nodes and a node can really die; and one two-actor pool, which the
tests below use in turn (the fourth kills one of its actors for good, the last test using the
second node removes it), since starting Ray nodes and actors costs seconds.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import runpy
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import anthropic
import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from tokentrail.adapter.config import SessionSettings  # noqa: E402
from tokentrail.adapter.http.server import start_server  # noqa: E402
from tokentrail.adapter.metrics import Metrics  # noqa: E402
from tokentrail.errors import EngineSpecError, JournalError, SessionLost  # noqa: E402
from tokentrail.kinds import LostReason  # noqa: E402
from tokentrail.scale import ActorHealth, ActorSpec, AdapterPool, FinishedBatch  # noqa: E402
from tokentrail.scale.actor import state_path  # noqa: E402
from tokentrail.scale.metrics import summed  # noqa: E402
from tokentrail.sim.harness import (  # noqa: E402
    CLAUDE_CODE_TOOLS,
    SYSTEM_PROMPT,
    HarnessSim,
    SessionSpec,
    Workspace,
    rerender_tool_input,
)

OBJECT_STORE = 80 * 1024 * 1024
SPEC = ActorSpec(engine="scripted")
TASK = "Fix the spacing in calc.py, add util.py with mul(), and write NOTES.md."
RAY_PAGE = Path(__file__).parent.parent / "docs" / "integrations" / "ray.md"
EXAMPLE = Path(__file__).parent.parent / "examples" / "ray_trainer_loop.py"


@pytest.fixture(scope="module")
def cluster():
    # CPUs for the module's pool (one actor per node), the docs example's (the same) and,
    # on the second node, the one-actor pool of the node that dies.
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 3,
            "resources": {"tokentrail": 2},
            "include_dashboard": False,
            "object_store_memory": OBJECT_STORE,
        },
    )
    cluster.add_node(
        num_cpus=2, resources={"tokentrail": 2, "second": 1}, object_store_memory=OBJECT_STORE
    )
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def pool(cluster, tmp_path_factory: pytest.TempPathFactory):
    journals = tmp_path_factory.mktemp("journals")
    pool = AdapterPool(SPEC, 2, journal_dir=journals, node_resource="tokentrail")
    yield pool
    pool.shutdown()


# -- sessions to run ------------------------------------------------------------------------------


def harness(url: str, sid: str, i: int) -> HarnessSim:
    """Session `i`: either protocol, its own seed and tool-result size."""
    return HarnessSim(
        url,
        sid,
        spec=SessionSpec(seed=i),
        protocol="anthropic" if i % 2 == 0 else "openai",
        workspace=Workspace(result_chars=150 * i),
    )


async def run_harnesses(urls: dict[str, str]) -> dict[str, int]:
    """Every session's harness at once; the requests each sent."""
    sims = [harness(url, sid, i) for i, (sid, url) in enumerate(urls.items())]
    results = await asyncio.gather(*(sim.run(TASK) for sim in sims))
    return {sim.session_id: r.requests for sim, r in zip(sims, results, strict=True)}


def as_dicts(samples: list[Any]) -> list[dict[str, Any]]:
    return [s.to_dict() for s in samples]


async def one_process(sids: list[str], tmp_path: Path, rewards: dict[str, float]) -> dict:
    """The same sessions on one in-process adapter built from the same spec: the reference."""
    adapter = SPEC.build(tmp_path / "one-process.db")
    runner, url = await start_server(adapter)
    try:
        for sid in sids:
            adapter.open_session(sid)
        await run_harnesses(dict.fromkeys(sids, url))
        out = {}
        for sid in sids:
            trajectory = await adapter.finish_trajectory(sid, reward=rewards[sid])
            out[sid] = (as_dicts(trajectory.samples), trajectory.ledger.to_dict())
        return out
    finally:
        await runner.cleanup()


class Stepper:
    """A Claude-Code-like client that sends one request at a time with the official SDK, which
    retries a refused connection with backoff, as real harnesses do."""

    def __init__(self, url: str, sid: str, seed: int) -> None:
        spec = SessionSpec(seed=seed, steps=6, context_tokens=1500)
        self.client = anthropic.AsyncAnthropic(base_url=url, api_key=sid, max_retries=12)
        self.system = f"{SYSTEM_PROMPT}\n{spec.plan(agent=False).marker()}"
        self.workspace = Workspace(result_chars=100 * seed)
        self.messages: list[dict] = [{"role": "user", "content": TASK}]
        self.done = False

    async def step(self) -> None:
        if self.done:
            return
        reply = await self.client.messages.create(
            model="tokentrail",
            max_tokens=2048,
            system=self.system,
            messages=copy.deepcopy(self.messages),
            tools=CLAUDE_CODE_TOOLS,
        )
        blocks, results = [], []
        for block in reply.content:
            b = block.model_dump(exclude_none=True)
            if b["type"] == "tool_use":
                b["input"] = rerender_tool_input(b["name"], b["input"], CLAUDE_CODE_TOOLS)
                text, _ = self.workspace.run(b["name"], b["input"])
                results.append({"type": "tool_result", "tool_use_id": b["id"], "content": text})
            blocks.append(b)
        self.messages.append({"role": "assistant", "content": blocks})
        if results:
            self.messages.append({"role": "user", "content": results})
        else:
            self.done = True


async def step_all(steppers: list[Stepper], steps: int | None = None) -> None:
    n = 0
    while not all(s.done for s in steppers) and (steps is None or n < steps):
        await asyncio.gather(*(s.step() for s in steppers))
        n += 1


async def stepped_one_process(sids: list[str], tmp_path: Path) -> dict:
    adapter = SPEC.build(tmp_path / "uninterrupted.db")
    runner, url = await start_server(adapter)
    try:
        for sid in sids:
            adapter.open_session(sid)
        await step_all([Stepper(url, sid, i) for i, sid in enumerate(sids)])
        out = {}
        for sid in sids:
            trajectory = await adapter.finish_trajectory(sid, reward=1.0)
            out[sid] = (as_dicts(trajectory.samples), trajectory.ledger.to_dict())
        return out
    finally:
        await runner.cleanup()


def wait_gone(pid: int) -> None:
    """Until process `pid` no longer exists (ray.kill returns before the process dies)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise TimeoutError(f"process {pid} is still alive")


def alive(pool: AdapterPool) -> list[ActorHealth]:
    """Every actor's health, all of them answering."""
    health = pool.check()
    assert all(h is not None for h in health)
    return [h for h in health if h is not None]


def metric(families: list, sample_name: str, **labels: str) -> float:
    """The sum of the samples named `sample_name` whose labels include `labels`."""
    return sum(
        s.value
        for f in families
        for s in f.samples
        if s.name == sample_name and labels.items() <= s.labels.items()
    )


# -- the tests ------------------------------------------------------------------------------------


def test_eight_sessions_on_two_actors_equal_one_process(pool: AdapterPool, tmp_path: Path) -> None:
    assert len({h.node_id for h in alive(pool)}) == 2, "one actor per node"

    sids = [f"rollout-{i}" for i in range(8)]
    placed = {sid: pool.open_session(sid) for sid in sids}
    # Least-loaded at open time: the sessions share the two actors evenly.
    assert sorted(p.actor for p in placed.values()) == [0] * 4 + [1] * 4
    requests = asyncio.run(run_harnesses({sid: p.url for sid, p in placed.items()}))

    # Stickiness: every turn of a session reached its actor, and no other actor knows it.
    by_actor = {h.index: h.sessions for h in alive(pool)}
    for sid in sids:
        mine = placed[sid].actor
        assert by_actor[mine][sid] == requests[sid]
        assert sid not in by_actor[1 - mine]

    rewards = {sid: float(i) for i, sid in enumerate(sids)}
    batch = pool.finish_many(rewards)
    assert batch.lost == {}
    assert list(batch.sessions) == sids
    reference = asyncio.run(one_process(sids, tmp_path, rewards))
    for sid in sids:
        finished = batch.sessions[sid]
        assert finished.actor == placed[sid].actor
        assert (as_dicts(finished.samples), finished.ledger.to_dict()) == reference[sid]
        # Through the object store: read-only views of the actor's shared columns, no copy.
        for sample in finished.samples:
            assert not sample.tokens.flags.writeable and sample.tokens.base is not None
    packed = batch.pack()
    assert packed.num_samples == len(batch.samples())
    assert np.array_equal(packed.rewards, [s.reward for s in batch.samples()])

    # Pool-wide metrics: the actors' counters summed, and the delivered ledgers' sum.
    generated = sum(s.ledger.generated_tokens for s in batch.sessions.values())
    families = pool.metrics()
    assert metric(families, "tokentrail_requests_total", status="200") == sum(requests.values())
    assert metric(families, "tokentrail_generated_tokens_total") == generated
    assert metric(families, "tokentrail_pool_generated_tokens_total") == generated
    assert pool.stats().totals.turns == sum(requests.values())
    with urllib.request.urlopen(pool.serve_metrics(), timeout=30) as resp:
        text = resp.read().decode()
    assert f"tokentrail_generated_tokens_total {float(generated)}" in text
    assert "tokentrail_pool_sessions_finished_total 8.0" in text
    # Or scrape each actor directly: each counts its own sessions.
    for target in pool.scrape_targets():
        with urllib.request.urlopen(target, timeout=30) as resp:
            assert b"tokentrail_generated_tokens_total" in resp.read()


def test_a_group_over_both_actors_packs_into_one_tree(pool: AdapterPool) -> None:
    """Rollouts of one group placed on different actors merge at their shared prompt."""
    sids = [f"grpo-{i}" for i in range(4)]
    placed = {sid: pool.open_session(sid, SessionSettings(group="task-3")) for sid in sids}
    assert {p.actor for p in placed.values()} == {0, 1}
    asyncio.run(run_harnesses({sid: p.url for sid, p in placed.items()}))
    batch = pool.finish_many({sid: float(i) for i, sid in enumerate(sids)})
    assert batch.lost == {}
    assert {s.metadata["group"] for s in batch.samples()} == {"task-3"}
    packed = batch.pack_tree()
    (tree,) = packed.trees.values()
    assert tree.num_rows == len(batch.samples())
    # One root block: the system prompt's first tokens, shared by every rollout.
    assert tree.block_parent.tolist().count(-1) == 1
    assert tree.stats.tree_tokens < tree.stats.row_tokens
    assert packed.session_stats() == {sid: s.ledger.layout for sid, s in batch.sessions.items()}


def test_a_turn_sent_to_another_actor_is_refused(pool: AdapterPool) -> None:
    session = pool.open_session("sticky")
    (wrong,) = [h for h in alive(pool) if h.index != session.actor]
    client = anthropic.Anthropic(base_url=wrong.url, api_key="sticky", max_retries=0)
    # Not a second, partial session of the same name on the wrong actor: a 404.
    with pytest.raises(anthropic.NotFoundError, match="not opened on this adapter"):
        client.messages.create(
            model="tokentrail", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        )
    assert "sticky" not in alive(pool)[wrong.index].sessions
    assert pool.drop_session("sticky")


def test_a_finish_whose_samples_never_arrived_is_answered_again_or_reported_lost(
    pool: AdapterPool,
) -> None:
    sids = ("finished-elsewhere", "finished-then-restarted")
    placed = [pool.open_session(sid) for sid in sids]
    asyncio.run(step_all([Stepper(p.url, p.sid, 0) for p in placed], steps=1))
    # The actors finish them, but the answers never reach the pool (as when a connection
    # breaks after the actor journaled the finish).
    first = {}
    for p in placed:
        shipped = ray.get(pool.actor_handle(p.actor).finish.remote([(p.sid, 1.0, {})]))
        first.update({s.sid: s for s in shipped.unpack()})
    # Asked again while the actor keeps the result (its finish retention): the same samples.
    again = pool.finish(sids[0], reward=1.0)
    assert as_dicts(again.samples) == as_dicts(first[sids[0]].samples) != []
    # Asked again after the actor restarted: the journal says it finished, the samples are
    # gone from memory, and the pool says so rather than answer an empty session.
    pid = alive(pool)[placed[1].actor].pid
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    with pytest.raises(SessionLost) as caught:
        pool.finish(sids[1])
    assert caught.value.reason == LostReason.FINISH_LOST
    assert "records the finish" in caught.value.detail


def test_killed_actors_recover_their_sessions_from_their_journals(
    pool: AdapterPool, tmp_path: Path
) -> None:
    sids = [f"failover-{i}" for i in range(4)]
    placed = [pool.open_session(sid) for sid in sids]
    steppers = {p.sid: Stepper(p.url, p.sid, i) for i, p in enumerate(placed)}
    on = {i: [p.sid for p in placed if p.actor == i] for i in (0, 1)}
    before = alive(pool)
    restarts = metric(pool.metrics(), "tokentrail_pool_actor_restarts_total")

    async def drive() -> FinishedBatch:
        # One event loop for every client: an SDK client's connections belong to its loop.
        await step_all(list(steppers.values()), steps=3)
        await step_all([steppers[sid] for sid in on[0]])  # actor 0's sessions are done
        # Both actors die at once, their sessions unfinished: actor 1's process by SIGKILL
        # in the middle of its sessions, actor 0 by `ray.kill`.
        os.kill(before[1].pid, signal.SIGKILL)
        ray.kill(pool.actor_handle(0), no_restart=False)
        await asyncio.to_thread(wait_gone, before[0].pid)
        # The pool finishes actor 0's sessions, waiting for its restart; meanwhile actor 1's
        # harnesses carry on: their requests are refused until Ray has restarted it on its
        # node, and the SDK retries them.
        finishing = asyncio.to_thread(pool.finish_many, dict.fromkeys(on[0], 1.0))
        batch, _ = await asyncio.gather(finishing, step_all([steppers[s] for s in on[1]]))
        return batch

    batch = asyncio.run(drive())
    later = pool.finish_many(dict.fromkeys(on[1], 1.0))

    assert batch.lost == later.lost == {}
    finished = {**batch.sessions, **later.sessions}
    reference = asyncio.run(stepped_one_process(sids, tmp_path))
    for sid in sids:
        assert steppers[sid].done
        assert (as_dicts(finished[sid].samples), finished[sid].ledger.to_dict()) == reference[sid]
    after = alive(pool)
    for old, new in zip(before, after, strict=True):
        assert new.starts == old.starts + 1 and new.pid != old.pid
        assert new.url == old.url, "the restarted actor serves on the port it had"
        assert sorted(new.recovered) == on[new.index]
    assert metric(pool.metrics(), "tokentrail_pool_actor_restarts_total") == restarts + 2


def test_sessions_that_cannot_come_back_are_reported_lost(pool: AdapterPool) -> None:
    sids = [f"doomed-{i}" for i in range(4)]
    placed = {sid: pool.open_session(sid) for sid in sids}
    asyncio.run(step_all([Stepper(p.url, sid, 1) for sid, p in placed.items()], steps=1))
    health = alive(pool)
    # Actor 0 loses its disk (journal removed), then its process: it restarts empty.
    journal = pool.journal_of(0)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{journal}{suffix}").unlink(missing_ok=True)
    assert state_path(journal).exists()
    os.kill(health[0].pid, signal.SIGKILL)
    # Actor 1 is killed for good.
    ray.kill(pool.actor_handle(1), no_restart=True)
    wait_gone(health[1].pid)

    batch = pool.finish_many(sids)
    assert batch.sessions == {}
    reasons = {sid: lost.reason for sid, lost in batch.lost.items()}
    on_1 = [sid for sid, p in placed.items() if p.actor == 1]
    assert reasons == {
        sid: LostReason.ACTOR_DIED if sid in on_1 else LostReason.NOT_RECOVERED for sid in sids
    }
    assert len(on_1) == 2
    with pytest.raises(SessionLost, match="actor_died") as caught:
        pool.finish(on_1[0])
    assert caught.value.reason == LostReason.ACTOR_DIED
    # The pool goes on with the actor that is left.
    survivor = pool.open_session("after")
    assert survivor.actor == 0
    asyncio.run(run_harnesses({"after": survivor.url}))
    assert pool.finish("after", reward=1.0).samples
    families = pool.metrics()
    assert metric(families, "tokentrail_pool_sessions_lost_total", reason="actor_died") == 2
    assert metric(families, "tokentrail_pool_actors", state="dead") == 1


def test_the_docs_example_is_the_script_and_runs(cluster, capsys) -> None:
    blocks = re.findall(r"```python\n(.*?)```", RAY_PAGE.read_text(), flags=re.S)
    assert EXAMPLE.read_text() in blocks, "docs/integrations/ray.md shows the example verbatim"
    example = runpy.run_path(str(EXAMPLE), run_name="example")
    example["main"](steps=1, sessions_per_step=4)
    out = capsys.readouterr().out
    assert re.search(r"step 0: 4 sessions, 4 samples, \d+ tokens, (\d+)/\1 generated", out), out


def test_turns_an_actor_s_journal_lost_are_stated_not_delivered_as_whole(
    cluster, tmp_path: Path
) -> None:
    """The actor's WAL loses its last commits (cut back to what it held before the sessions'
    second turns) and the actor is SIGKILLed: Ray restarts it, its journal recovers the
    sessions without those turns, and the pool says so: `SessionLost` (`journal_damaged`)
    with what was lost, or with `accept_lost` the first turns, the loss in the ledger."""
    pool = AdapterPool(SPEC, 1, journal_dir=tmp_path, node_resource="tokentrail")
    try:
        sids = ["cut-0", "cut-1"]
        placed = [pool.open_session(sid) for sid in sids]
        steppers = [Stepper(p.url, p.sid, i + 1) for i, p in enumerate(placed)]
        wal = Path(f"{pool.journal_of(0)}-wal")

        async def drive() -> int:
            await step_all(steppers, steps=1)
            mark = wal.stat().st_size
            await step_all(steppers, steps=1)
            return mark

        mark = asyncio.run(drive())
        (health,) = alive(pool)
        assert wal.stat().st_size > mark
        os.truncate(wal, mark)
        os.kill(health.pid, signal.SIGKILL)
        wait_gone(health.pid)
        with pytest.raises(SessionLost) as caught:
            pool.finish("cut-0", reward=1.0)
        lost = caught.value
        assert lost.reason == LostReason.JOURNAL_DAMAGED
        assert lost.lost is not None and lost.lost["turns"] == 1, lost.lost
        assert "1 turns" in lost.detail and "WAL tail" in lost.detail
        assert pool.lost()["cut-0"].lost == lost.lost
        kept = pool.finish("cut-1", reward=1.0, accept_lost=True)
        assert kept.ledger.lost_turns == 1 and len(kept.ledger.turns) == 1
        assert kept.samples and all(s.metadata["lost"]["turns"] == 1 for s in kept.samples)
    finally:
        pool.shutdown()


def test_a_dead_node_loses_its_sessions_with_that_reason(cluster, tmp_path: Path) -> None:
    (node,) = cluster.worker_nodes
    pool = AdapterPool(SPEC, 1, journal_dir=tmp_path, node_resource="second", restart_timeout_s=20)
    try:
        session = pool.open_session("on-a-dead-node")
        asyncio.run(step_all([Stepper(session.url, session.sid, 0)], steps=2))
        cluster.remove_node(node)
        with pytest.raises(SessionLost) as caught:
            pool.finish("on-a-dead-node")
        assert caught.value.reason == LostReason.NODE_DIED
        assert pool.lost()["on-a-dead-node"].reason == LostReason.NODE_DIED
    finally:
        pool.shutdown()


def test_a_bad_spec_is_refused_before_any_actor_starts(cluster) -> None:
    with pytest.raises(EngineSpecError, match="unknown engine spec 'sglang-typo"):
        AdapterPool(ActorSpec(engine="sglang-typo://10.0.0.5:30000"), 2)
    with pytest.raises(JournalError, match="sync mode"):
        AdapterPool(ActorSpec(journal_sync="always"), 2)


def test_summed_metrics_add_counters_and_histograms() -> None:
    a, b = Metrics(), Metrics()
    a.request_done("anthropic", 200)
    b.request_done("anthropic", 200)
    b.request_done("openai", 400)
    a.in_flight(+2)
    b.in_flight(+1)
    families = summed([list(a.registry.collect()), list(b.registry.collect())])
    assert metric(families, "tokentrail_requests_total", protocol="anthropic") == 2
    assert metric(families, "tokentrail_requests_total", protocol="openai") == 1
    assert metric(families, "tokentrail_requests_in_flight") == 3
    created = [s.value for f in families for s in f.samples if s.name.endswith("_created")]
    assert created and all(v > 1e9 for v in created), "timestamps are not added up"
