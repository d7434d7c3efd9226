"""Replay rows within the memory budget (`trajectory.replay_pool`): a manager that pools its
sessions' rows keeps them on the heap up to its budget and in a file per session past it, and
every sample carries exactly the rows it carries when the store keeps them on its tapes.

Random sessions (continuations, branches, re-rendered tokens, engines asked from too late a
start, turns without rows) run through managers with the rows on the store's tapes, pooled on
the heap, pooled half on the heap and half in files, and all in files; their samples' routed
experts and indexer top-k are compared byte for byte.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import re

import aiohttp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.fake_engines import IM_END, FakeSGLang
from tokens import assistant, prompt_ids, sampled, system, tool, user
from tokentrail import TrajectoryManager, TurnRecord
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.adapter.http.memory import REPLAY_SHARE
from tokentrail.core.routing import IndexerShape, ReplayRows, RoutingShape
from tokentrail.engines import ScriptedEngine, SGLangEngine
from tokentrail.errors import ReplayError
from tokentrail.kinds import ReplayGap
from tokentrail.scale.transfer import ShippedBatch
from tokentrail.sim.moe import KVRouting
from tokentrail.storage.journal import Journal
from tokentrail.trajectory.linearize import Trajectory

SHAPE = RoutingShape(4, 2, 300)  # uint16 rows
INDEXER = IndexerShape(2, 3)
MESSAGES = [system("s"), user("do it"), user("do that"), tool("ok"), tool("fail")]


def routed(n: int, tag: int) -> np.ndarray:
    """`n` rows of routed experts that differ by turn (`tag`) and position."""
    rows = np.arange(n * SHAPE.layers * SHAPE.top_k).reshape(n, SHAPE.layers, SHAPE.top_k)
    return ((rows * 7 + tag * 31) % SHAPE.num_experts).astype(np.int32)


def indexed(n: int, tag: int) -> np.ndarray:
    rows = np.arange(n * INDEXER.layers * INDEXER.top_k).reshape(n, *INDEXER.dims)
    return np.where(rows % 5 == 0, -1, rows + tag).astype(np.int32)


@st.composite
def sessions(draw: st.DrawFn) -> list[tuple[list[dict], dict, int | None, int, str]]:
    """Turns that continue an earlier conversation, branch off or start anew; some re-render
    a token, some ask the engine from a later or earlier start, some come without rows."""
    convos: list[list[dict]] = []
    turns = []
    for k in range(draw(st.integers(1, 8))):
        if convos and draw(st.booleans()):
            history = list(draw(st.sampled_from(convos)))
        else:
            history = [draw(st.sampled_from(MESSAGES[:3]))]
        reply = assistant(f"r{k}" + "x" * draw(st.integers(0, 6)))
        drift = draw(st.none() | st.integers(0, 10_000))
        shift = draw(st.integers(-3, 3))
        rows = draw(st.sampled_from(["rows", "rows", "rows", "gap", "none"]))
        turns.append((history, reply, drift, shift, rows))
        convos.append([*history, reply, draw(st.sampled_from(MESSAGES[1:]))])
    return turns


def play(manager: TrajectoryManager, turns, sid: str = "s") -> None:
    for tag, (history, reply, drift, shift, kind) in enumerate(turns):
        prompt = prompt_ids(history)
        if drift is not None:
            prompt[drift % len(prompt)] = 7
        output = sampled(reply)
        start = manager.replay_start(sid, history, prompt, None)
        start = min(len(prompt), max(0, start + shift))
        n = len(prompt) + len(output) - 1 - start
        if kind == "rows":
            replay = {
                "routed_experts": ReplayRows(routed(n, tag), start),
                "indexer_topk": ReplayRows(indexed(n, tag), start),
            }
        elif kind == "gap":
            replay = {
                "routed_experts": ReplayRows.missing(ReplayGap.ENGINE_RETURNED_NONE),
                "indexer_topk": ReplayRows.missing(ReplayGap.NOT_SUPPORTED),
            }
        else:
            replay = {}
        manager.record_turn(
            sid,
            turn=TurnRecord(prompt, output, "stop", **replay),
            prompt_messages=history,
            response_message=reply,
        )


def replay_of(traj: Trajectory) -> list[tuple]:
    return [
        (
            s.tokens.tobytes(),
            s.routed_experts.dtype.str,
            s.routed_experts.shape,
            s.routed_experts.tobytes(),
            s.indexer_topk.dtype.str,
            s.indexer_topk.shape,
            s.indexer_topk.tobytes(),
            s.metadata["replay"],
        )
        for s in traj.samples
    ]


def store_bytes(manager: TrajectoryManager) -> int:
    return manager._sessions["s"].store.nbytes()  # noqa: SLF001 - what the store holds


@settings(max_examples=60, deadline=None)
@given(turns=sessions())
def test_pooled_rows_on_the_heap_or_in_files_are_the_store_s_byte_for_byte(turns) -> None:
    for backend in ("rust", "python"):
        tapes = TrajectoryManager(backend=backend, routing=SHAPE, indexer=INDEXER)
        play(tapes, turns)
        on_tapes = store_bytes(tapes)
        expected = replay_of(tapes.finish("s"))
        # All on the heap, all in files, and a budget the session crosses halfway.
        row_bytes = SHAPE.row_bytes + INDEXER.row_bytes
        for budget in (2**40, 0, 40 * row_bytes):
            manager = TrajectoryManager(
                backend=backend, routing=SHAPE, indexer=INDEXER, replay_memory=budget
            )
            play(manager, turns)
            pool = manager.replay_pool
            assert pool is not None
            # The pool holds the rows the tapes hold, each position's once (its store numbers).
            rows = (on_tapes - store_bytes(manager)) // (row_bytes - 8)
            assert pool.heap_bytes + pool.spilled_bytes == rows * row_bytes
            if budget == 0:
                assert pool.heap_bytes == 0
            assert replay_of(manager.finish("s")) == expected, (backend, budget)
            assert (pool.heap_bytes, pool.spilled_bytes) == (0, 0), "finish gives them back"


def long_turn(manager: TrajectoryManager, sid: str, tokens: int) -> None:
    """One turn of `tokens` prompt + output tokens, with rows for all but the last."""
    rng = np.random.default_rng(len(sid))
    prompt = rng.integers(10, 50_000, tokens - 8).tolist()
    rows = rng.integers(0, SHAPE.num_experts, (tokens - 1, SHAPE.layers, SHAPE.top_k))
    manager.record_turn(
        sid,
        turn=TurnRecord(prompt, [5] * 8, "stop", routed_experts=ReplayRows(rows, 0)),
        prompt_messages=[user(sid)],
        response_message=assistant("done"),
    )


def open_under(directory) -> list[str]:
    """The files under `directory` this process holds a descriptor of."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
        if target.startswith(str(directory)):
            found.append(target)
    return found


def test_sessions_beyond_the_budget_keep_their_rows_in_a_file_not_the_heap(tmp_path) -> None:
    tokens = 2_000
    one = (tokens - 1) * SHAPE.row_bytes
    manager = TrajectoryManager(
        routing=SHAPE, replay_memory=int(1.5 * one), replay_dir=str(tmp_path)
    )
    pool = manager.replay_pool
    assert pool is not None
    orphan = tmp_path / "tokentrail-replay-999999999-x1y2"  # of a process killed before exit
    orphan.mkdir()
    (orphan / "0-routed_experts.rows").write_bytes(b"old")
    for sid in ("a", "b", "c"):
        long_turn(manager, sid, tokens)
    assert not open_under(tmp_path), "a spilled session holds no descriptor"
    assert not orphan.exists()
    (spill_dir,) = tmp_path.iterdir()
    assert spill_dir.name.startswith(f"tokentrail-replay-{os.getpid()}-")
    assert sorted(p.stat().st_size for p in spill_dir.iterdir()) == [one, one]
    # The first fits the budget; the next two would take the heap past it.
    assert (pool.heap_bytes, pool.spilled_bytes, pool.sessions_spilled) == (one, 2 * one, 2)
    rows = {sid: manager._sessions[sid].rows for sid in "abc"}  # noqa: SLF001 - what it holds
    assert all(r is not None for r in rows.values())
    assert rows["a"].view("routed_experts") is None and rows["a"].heap_bytes == one
    for sid in "bc":
        held = rows[sid].view("routed_experts")
        assert isinstance(held, np.memmap) and held.shape == (tokens - 1, 4, 2)
        assert rows[sid].heap_bytes == 0
    # Read back at finish: the rows the engine reported, the file then gone.
    reference = TrajectoryManager(routing=SHAPE)
    long_turn(reference, "b", tokens)
    (want,) = reference.finish("b").samples
    (got,) = manager.finish("b").samples
    assert got.routed_experts.tobytes() == want.routed_experts.tobytes()
    assert not isinstance(got.routed_experts, np.memmap) and got.routed_experts.base is None
    assert (pool.heap_bytes, pool.spilled_bytes) == (one, one)
    assert manager.drop_session("c")
    assert (pool.heap_bytes, pool.spilled_bytes) == (one, 0)
    assert list(spill_dir.iterdir()) == []


def test_a_spilled_session_appends_its_later_turns_to_its_file() -> None:
    one = 99 * SHAPE.row_bytes
    manager = TrajectoryManager(routing=SHAPE, replay_memory=one)
    tapes = TrajectoryManager(routing=SHAPE)
    history = [user("go")]
    for k in range(3):
        for m in (manager, tapes):
            prompt = prompt_ids(history)
            output = sampled(assistant(f"step {k}" * 20))
            start = m.replay_start("s", history, prompt, None)
            rows = routed(len(prompt) + len(output) - 1 - start, k)
            m.record_turn(
                "s",
                turn=TurnRecord(prompt, output, "stop", routed_experts=ReplayRows(rows, start)),
                prompt_messages=history,
                response_message=assistant(f"step {k}" * 20),
            )
        history = [*history, assistant(f"step {k}" * 20), user(f"next {k}")]
    pool = manager.replay_pool
    assert pool is not None and pool.sessions_spilled == 1 and pool.heap_bytes == 0
    (got,), (want,) = manager.finish("s").samples, tapes.finish("s").samples
    assert got.routed_experts.tobytes() == want.routed_experts.tobytes()


@pytest.mark.parametrize("budget", [2**30, 0])
def test_rows_that_do_not_fit_are_refused_and_nothing_is_kept(budget: int) -> None:
    manager = TrajectoryManager(routing=SHAPE, replay_memory=budget)
    tapes = TrajectoryManager(routing=SHAPE)
    pool = manager.replay_pool
    assert pool is not None
    history = [user("go")]
    first = assistant("first")
    prompt, output = prompt_ids(history), sampled(first)
    n = len(prompt) + len(output) - 1
    for m in (manager, tapes):
        turn = TurnRecord(prompt, output, "stop", routed_experts=ReplayRows(routed(n, 1), 0))
        m.record_turn("s", turn=turn, prompt_messages=history, response_message=first)
    held = (pool.heap_bytes, pool.spilled_bytes)
    assert sum(held) == n * SHAPE.row_bytes
    history = [user("go"), first, user("more")]
    prompt, output = prompt_ids(history), [5, 6]
    start = manager.replay_start("s", history, prompt, None)
    n = len(prompt) + len(output) - 1 - start
    bad = {
        f"rows of shape ({n}, 4, 3) for a store of 4 layers x 2": np.zeros((n, 4, 3), np.int32),
        "value 300 at row 0 is outside": np.full((n, 4, 2), 300, np.int32),
        "rows must be a 3-D integer array": np.zeros((n, 4, 2), np.float32),
        "rows from position": np.zeros((n + 1, 4, 2), np.int32),  # the store counts them
    }
    for message, rows in bad.items():
        turn = TurnRecord(prompt, output, "stop", routed_experts=ReplayRows(rows, start))
        with pytest.raises(ReplayError, match=re.escape(message)):
            manager.record_turn(
                "s", turn=turn, prompt_messages=history, response_message=assistant("x")
            )
        assert (pool.heap_bytes, pool.spilled_bytes) == held and manager.turn_count("s") == 1
    for m in (manager, tapes):
        turn = TurnRecord(prompt, output, "stop", routed_experts=ReplayRows(routed(n, 2), start))
        m.record_turn("s", turn=turn, prompt_messages=history, response_message=assistant("x"))
    assert replay_of_routed(manager.finish("s")) == replay_of_routed(tapes.finish("s"))


def replay_of_routed(traj: Trajectory) -> list[bytes]:
    return [s.routed_experts.tobytes() for s in traj.samples]


def test_the_adapter_pools_replay_rows_within_its_memory_budget(tokenizer, tmp_path) -> None:
    manager = TrajectoryManager(routing=SHAPE)
    Adapter(
        engine=ScriptedEngine(tokenizer),
        tokenizer=tokenizer,
        manager=manager,
        config=AdapterConfig(routed_experts=True, max_memory=8 << 30),
    )
    assert manager.replay_pool is not None
    assert manager.replay_pool.max_bytes == int(REPLAY_SHARE * (8 << 30))
    plain = TrajectoryManager()
    Adapter(engine=ScriptedEngine(tokenizer), tokenizer=tokenizer, manager=plain)
    assert plain.replay_pool is None, "no replay channel, nothing to pool"


def test_the_ray_pool_ships_routed_experts_as_one_typed_column_out_of_band() -> None:
    """What an actor returns (`ShippedBatch`) holds the rows as one `[tokens, 48, 8]` uint8
    column that pickle protocol 5 (Ray's object store) carries as a buffer of its own, and the
    trainer's samples are views of it: no nested lists, no JSON, no copy."""
    shape = RoutingShape(48, 8, 128)
    manager = TrajectoryManager(routing=shape, replay_memory=0)
    rng = np.random.default_rng(3)
    for sid in ("a", "b"):
        prompt = rng.integers(10, 50_000, 3_000).tolist()
        rows = rng.integers(0, 128, (3_000 + 8 - 1, 48, 8))
        manager.record_turn(
            sid,
            turn=TurnRecord(prompt, [5] * 8, "stop", routed_experts=ReplayRows(rows, 0)),
            prompt_messages=[user(sid)],
            response_message=assistant("done"),
        )
    finished = {sid: manager.finish(sid) for sid in ("a", "b")}
    batch = ShippedBatch.of(0, finished)
    column = batch.columns["routed_experts"]
    assert column.dtype == np.uint8 and column.shape == (2 * 3_008, 48, 8)
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
    assert len(head) < 20_000, "the rows travel out of band, not in the pickle"
    assert column.nbytes in [memoryview(b).nbytes for b in buffers]
    back = pickle.loads(head, buffers=buffers)
    for session in back.unpack():
        (sample,) = session.samples
        (want,) = finished[session.sid].samples
        assert sample.routed_experts.tobytes() == want.routed_experts.tobytes()
        assert np.shares_memory(sample.routed_experts, back.columns["routed_experts"])


def test_an_adapter_spills_rows_next_to_its_journal_and_finishes_them_whole(
    tokenizer, tmp_path
) -> None:
    """Over HTTP against a stand-in SGLang that keeps rows per prefix: a session whose rows
    are past the budget keeps them beside the journal, and its sample carries the rows the
    engine computed for every token."""
    kv = KVRouting(SHAPE)
    fake = FakeSGLang(text_reply(tokenizer), routing=kv)

    async def go() -> tuple[Trajectory, list[str]]:
        async with fake as srv:
            adapter = Adapter(
                engine=SGLangEngine(srv.url, tokenizer),
                tokenizer=tokenizer,
                manager=TrajectoryManager(routing=SHAPE),
                config=AdapterConfig(routed_experts=True),
                journal=Journal(tmp_path / "run.db"),
            )
            pool = adapter.manager.replay_pool
            assert pool is not None and pool.directory == str(tmp_path)
            pool.max_bytes = 0  # every session past the budget
            runner, url = await start_server(adapter)
            try:
                await converse(url, "s1", 3)
                spilled = [p.name for p in tmp_path.glob("tokentrail-replay-*/*")]
                assert pool.spilled_bytes > 0 and pool.heap_bytes == 0
                async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
                    metrics = await resp.text()
                held = f'tokentrail_replay_rows_bytes{{held="file"}} {float(pool.spilled_bytes)}'
                assert held in metrics and 'rows_bytes{held="heap"} 0.0' in metrics
                return await adapter.finish_trajectory("s1", reward=1.0), spilled
            finally:
                await runner.cleanup()
                adapter.journal.close()

    traj, spilled = asyncio.run(go())
    assert spilled == ["0-routed_experts.rows"]
    (sample,) = traj.samples
    n = len(sample.tokens)
    assert traj.ledger.replay["routed_experts"].complete
    held, computed_by = kv.rows_of(sample.tokens)
    assert sample.routed_experts.dtype == SHAPE.dtype
    assert sample.routed_experts[: n - 1].tolist() == held[: n - 1].tolist()
    assert len(set(computed_by[: n - 1].tolist())) == 3, "rows of all three requests"


def text_reply(tokenizer):
    def reply(input_ids: list[int]) -> tuple[list[int], list[float], str]:
        ids = tokenizer.encode(f"Step {len(input_ids)} done.") + [IM_END]
        return ids, [-0.25] * len(ids), "stop"

    return reply


async def converse(url: str, sid: str, turns: int) -> None:
    messages: list[dict] = [{"role": "user", "content": "fix the bug"}]
    async with aiohttp.ClientSession() as http:
        for k in range(turns):
            body = {"model": "m", "max_tokens": 64, "messages": messages}
            async with http.post(
                f"{url}/v1/messages", json=body, headers={"x-api-key": sid}
            ) as resp:
                assert resp.status == 200, await resp.text()
                answer = await resp.json()
            messages += [
                {"role": "assistant", "content": answer["content"]},
                {"role": "user", "content": f"and now part {k}"},
            ]


def test_rows_stay_on_the_heap_when_no_file_can_be_made(tmp_path, caplog) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    manager = TrajectoryManager(routing=SHAPE, replay_memory=0, replay_dir=str(blocked))
    reference = TrajectoryManager(routing=SHAPE)
    for m in (manager, reference):
        for sid in ("a", "b"):
            long_turn(m, sid, 500)
    pool = manager.replay_pool
    assert pool is not None and pool.failed
    assert (pool.heap_bytes, pool.spilled_bytes) == (2 * 499 * SHAPE.row_bytes, 0)
    assert caplog.text.count("replay rows past the budget stay on the heap") == 1
    for sid in ("a", "b"):
        (got,), (want,) = manager.finish(sid).samples, reference.finish(sid).samples
        assert got.routed_experts.tobytes() == want.routed_experts.tobytes()
    assert pool.heap_bytes == 0
