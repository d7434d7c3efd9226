"""Routing replay through the agent path: the adapter asks SGLang for each turn's routed
experts from where the session's earlier turns stop, and every sample token carries the row
the engine reported in the request that computed it.

A stand-in SGLang server (`FakeSGLang` over `KVRouting`) keeps rows per prefix like a radix
cache: a cached prefix comes back as stored when first computed, anything new is computed from
the request, so a row taken from the wrong turn shows. Spliced sessions, branches, a flushed
cache, the indexer top-k and weight versions go through the adapter; a property test runs
random sessions through the manager; the ledger names every token without its rows.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from support.fake_engines import IM_END, FakeSGLang, indexer_rows
from tokens import assistant, prompt_ids, sampled, system, tool, user
from tokentrail import TrajectoryManager, TurnRecord, cli
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.cli.serve import ServeSettings, replay_shapes, resolve_settings
from tokentrail.core.routing import IndexerShape, ReplayRows, RoutingShape
from tokentrail.engines import ScriptedEngine, SGLangEngine
from tokentrail.errors import ReplayError, SettingError
from tokentrail.kinds import History
from tokentrail.sim.moe import KVRouting
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.read import read_journal
from tokentrail.storage.replay import Settings, as_recorded, replay

SHAPE = RoutingShape(4, 2, 16)
INDEXER = IndexerShape(2, 3)
SYSTEM = "You are a careful coding agent."


def text_reply(tokenizer, think: bool = False) -> Callable[[list[int]], Any]:
    """A reply whose text depends on the prompt's length, so every turn samples new ids."""

    def reply(input_ids: list[int]) -> tuple[list[int], list[float], str]:
        text = f"Step {len(input_ids)} done."
        if think:
            text = f"<think>\nprompt of {len(input_ids)}\n</think>\n\n{text}"
        ids = tokenizer.encode(text) + [IM_END]
        return ids, [-0.25] * len(ids), "stop"

    return reply


async def converse(url: str, sid: str, first: str, turns: int) -> None:
    """`turns` Anthropic requests, each sending the history back with a new user message."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
    async with aiohttp.ClientSession() as http:
        for k in range(turns):
            body = {"model": "m", "max_tokens": 64, "system": SYSTEM, "messages": messages}
            async with http.post(
                f"{url}/v1/messages", json=body, headers={"x-api-key": sid}
            ) as resp:
                assert resp.status == 200, await resp.text()
                answer = await resp.json()
            messages += [
                {"role": "assistant", "content": answer["content"]},
                {"role": "user", "content": f"and now part {k}"},
            ]


def adapter_for(engine, tokenizer, *, journal=None, history=History.SPLICE, indexer=False):
    return Adapter(
        engine=engine,
        tokenizer=tokenizer,
        manager=TrajectoryManager(routing=SHAPE, indexer=INDEXER if indexer else None),
        config=AdapterConfig(routed_experts=True, indexer_topk=indexer, history=history),
        journal=journal,
    )


def session(adapter: Adapter, *conversations: tuple[str, int], sid: str = "s1"):
    async def go():
        runner, url = await start_server(adapter)
        try:
            for first, turns in conversations:
                await converse(url, sid, first, turns)
            return await adapter.finish_trajectory(sid, reward=1.0)
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def with_fake(fake: FakeSGLang, run: Callable[[str], Any]) -> Any:
    async def go():
        async with fake as srv:
            return await asyncio.to_thread(run, srv.url)

    return asyncio.run(go())


def test_a_spliced_session_carries_every_token_s_row_from_the_request_that_computed_it(
    tokenizer,
) -> None:
    kv = KVRouting(SHAPE)
    fake = FakeSGLang(text_reply(tokenizer), routing=kv)

    def run(url: str):
        adapter = adapter_for(SGLangEngine(url, tokenizer), tokenizer)
        # A main conversation of four turns, then a sub-agent sharing only the system prompt.
        return session(adapter, ("fix the bug", 4), ("survey the repo", 2))

    traj = with_fake(fake, run)
    bodies = fake.bodies("/generate")
    assert len(bodies) == 6
    # Each continuing turn asks only from the last token the session did not feed forward.
    for k in (1, 2, 3):
        before = len(bodies[k - 1]["input_ids"]) + fake.answers[k - 1]["completion_tokens"]
        assert bodies[k]["routed_experts_start_len"] == before - 1
    # The sub-agent has no earlier turn: it asks from 0 and gets the cached system prompt back
    # as the main conversation stored it.
    assert bodies[4]["routed_experts_start_len"] == 0
    assert fake.answers[4]["cached_tokens"] > 0

    coverage = traj.ledger.replay["routed_experts"]
    assert coverage.complete and coverage.tokens == sum(len(s.tokens) - 1 for s in traj.samples)
    assert len(traj.samples) == 2
    for sample in traj.samples:
        n = len(sample.tokens)
        assert sample.routed_experts.shape == (n, 4, 2)
        assert sample.routed_experts.dtype == np.uint8, "16 experts fit a byte"
        held, computed_by = kv.rows_of(sample.tokens)
        assert sample.routed_experts[: n - 1].tolist() == held[: n - 1].tolist()
        assert sample.routed_experts[n - 1].tolist() == [[0, 0]] * 4
        assert sample.metadata["replay"]["routed_experts"]["missing"] == {}
        # Rows of one sample come from several requests: each token's from the one that
        # computed it, the main conversation's prefix from its first turn.
        assert len(set(computed_by[: n - 1].tolist())) > 1
    main, sub = traj.samples
    system_len = int(np.argmax(main.tokens[: len(sub.tokens)] != sub.tokens[: len(main.tokens)]))
    assert sub.routed_experts[:system_len].tolist() == main.routed_experts[:system_len].tolist()


def test_stitched_rows_are_byte_identical_to_one_full_request(tokenizer) -> None:
    fake = FakeSGLang(text_reply(tokenizer), routing=KVRouting(SHAPE))

    def run(url: str):
        traj = session(adapter_for(SGLangEngine(url, tokenizer), tokenizer), ("go", 5))
        (sample,) = traj.samples
        # Miles's oracle: one request over the final tokens but the last, start 0.
        body = {
            "input_ids": sample.tokens[:-1].tolist(),
            "sampling_params": {"max_new_tokens": 1},
            "return_logprob": True,
            "return_routed_experts": True,
            "routed_experts_start_len": 0,
        }

        async def full() -> dict:
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{url}/generate", json=body) as resp:
                    return await resp.json()

        return sample, asyncio.run(full())

    sample, answer = with_fake(fake, run)
    oracle = base64.b64decode(answer["meta_info"]["routed_experts"])
    stitched = sample.routed_experts[:-1].astype("<i4").tobytes()
    assert len(oracle) == (len(sample.tokens) - 1) * 4 * 2 * 4
    assert stitched == oracle


def test_a_flushed_cache_keeps_the_rows_the_first_turn_reported(tokenizer) -> None:
    kv = KVRouting(SHAPE)
    fake = FakeSGLang(text_reply(tokenizer), routing=kv)

    class Flushing(SGLangEngine):
        async def generate(self, req):
            kv.flush()  # as /flush_cache or a weight update between turns
            return await super().generate(req)

    traj = with_fake(
        fake, lambda url: session(adapter_for(Flushing(url, tokenizer), tokenizer), ("go", 2))
    )
    (sample,) = traj.samples
    first = fake.answers[0]
    rows = np.frombuffer(base64.b64decode(first["routed_experts"]), "<i4").reshape(-1, 4, 2)
    # The second turn recomputed the prefix but was asked only for what is new: the prefix
    # keeps turn 1's rows, not the recomputation's.
    assert sample.routed_experts[: len(rows)].tolist() == rows.tolist()
    recomputed, _ = kv.rows_of(sample.tokens)
    assert recomputed[: len(rows)].tolist() != rows.tolist()


def test_weight_versions_are_carried_per_trained_span_and_counted(tokenizer) -> None:
    fake = FakeSGLang(text_reply(tokenizer), routing=KVRouting(SHAPE))

    class Updating(SGLangEngine):
        async def generate(self, req):
            fake.weight_version = f"step-{len(fake.requests) // 2}"
            return await super().generate(req)

    traj = with_fake(
        fake, lambda url: session(adapter_for(Updating(url, tokenizer), tokenizer), ("go", 4))
    )
    (sample,) = traj.samples
    spans = sample.metadata["weight_versions"]
    assert [s["version"] for s in spans] == ["step-0", "step-0", "step-1", "step-1"]
    for span in spans:
        trained = sample.loss_mask[
            span["start"] - sample.prompt_length : span["end"] - sample.prompt_length
        ]
        assert span["trained"] == int(trained.sum()) == span["end"] - span["start"]
    versions = traj.ledger.weight_versions
    assert set(versions) == {"step-0", "step-1"}
    assert sum(v["generated"] for v in versions.values()) == traj.ledger.generated_tokens
    assert sum(v["trained"] for v in versions.values()) == traj.ledger.trained_tokens


def test_the_indexer_top_k_rides_along(tokenizer) -> None:
    fake = FakeSGLang(text_reply(tokenizer), routing=KVRouting(SHAPE), indexer=INDEXER)
    traj = with_fake(
        fake,
        lambda url: session(
            adapter_for(SGLangEngine(url, tokenizer), tokenizer, indexer=True), ("go", 3)
        ),
    )
    (sample,) = traj.samples
    n = len(sample.tokens)
    assert sample.indexer_topk.dtype == np.int32 and sample.indexer_topk.shape == (n, 2, 3)
    assert sample.indexer_topk[: n - 1].tolist() == indexer_rows(n - 1, INDEXER).tolist()
    assert traj.ledger.replay["indexer_topk"].complete
    assert all(body["return_indexer_topk"] for body in fake.bodies("/generate"))


@pytest.mark.parametrize(
    ("engine", "reason"),
    [("no-flag", "engine_returned_none"), ("other-shape", "shape_mismatch"),
     ("scripted", "not_supported")],
)  # fmt: skip
def test_tokens_without_rows_are_counted_by_reason(tokenizer, engine, reason, caplog) -> None:
    routing = {"no-flag": None, "other-shape": KVRouting(RoutingShape(5, 2, 16))}
    fake = FakeSGLang(text_reply(tokenizer), routing=routing.get(engine))

    def run(url: str):
        chosen = ScriptedEngine(tokenizer) if engine == "scripted" else SGLangEngine(url, tokenizer)
        adapter = adapter_for(chosen, tokenizer)
        traj = session(adapter, ("go", 2))
        return traj, adapter.metrics.render()[0].decode()

    with caplog.at_level(logging.WARNING):
        traj, metrics = with_fake(fake, run)
    coverage = traj.ledger.replay["routed_experts"]
    assert coverage.present == 0 and coverage.missing == {reason: coverage.tokens} != {}
    assert f"replay rows missing: routed_experts 0/{coverage.tokens}" in caplog.text
    line = f'tokentrail_replay_tokens_total{{channel="routed_experts",status="{reason}"}}'
    assert f"{line} {float(coverage.tokens)}" in metrics
    for sample in traj.samples:
        assert not sample.routed_experts.any()


def test_routing_without_the_model_shape_is_refused(tokenizer) -> None:
    with pytest.raises(ReplayError, match="needs the model's routing shape"):
        Adapter(
            engine=ScriptedEngine(tokenizer),
            tokenizer=tokenizer,
            config=AdapterConfig(routed_experts=True),
        )


# --- journal, replay and the audit gate ------------------------------------------------------


def test_a_journal_keeps_the_rows_through_recovery_and_replay(tokenizer, tmp_path) -> None:
    kv = KVRouting(SHAPE)
    fake = FakeSGLang(text_reply(tokenizer, think=True), routing=kv)
    path = tmp_path / "run.db"

    def run(url: str):
        adapter = adapter_for(SGLangEngine(url, tokenizer), tokenizer, journal=Journal(path))

        async def go():
            runner, url_ = await start_server(adapter)
            try:
                await converse(url_, "s1", "go", 3)
            finally:
                await runner.cleanup()

        asyncio.run(go())
        adapter.journal.close()  # the process ends
        # A restart: the unfinished session is rebuilt from the journal, rows included.
        restarted = adapter_for(SGLangEngine(url, tokenizer), tokenizer, journal=Journal(path))
        return asyncio.run(restarted.finish_trajectory("s1"))

    traj = with_fake(fake, run)
    (sample,) = traj.samples
    n = len(sample.tokens)
    assert traj.ledger.replay["routed_experts"].complete
    assert sample.routed_experts[: n - 1].tolist() == kv.rows_of(sample.tokens)[0][: n - 1].tolist()

    contents = read_journal(path)
    (recorded,) = as_recorded(contents).values()
    assert recorded.samples[0].routed_experts.tobytes() == sample.routed_experts.tobytes()
    # Re-rendered in full with a template that drops earlier turns' reasoning, the prompts are
    # not what the engine saw, so their rows are another sequence's.
    settings = Settings.recorded(contents.meta)
    assert settings.routing == SHAPE
    strip = (Path(__file__).parent / "templates" / "qwen3_strip_think.jinja").read_text()
    render = Settings(history=History.RENDER, routing=SHAPE)
    rerendered = replay(contents, render, tokenizer, template=strip)
    coverage = next(iter(rerendered.values())).ledger.replay["routed_experts"]
    assert coverage.present > 0 and coverage.missing.get("rerendered_prefix", 0) > 0


def test_journaled_rows_of_another_shape_are_a_mismatch_not_a_crash(tokenizer, tmp_path) -> None:
    fake = FakeSGLang(text_reply(tokenizer), routing=KVRouting(SHAPE))
    path = tmp_path / "run.db"

    def run(url: str):
        adapter = adapter_for(SGLangEngine(url, tokenizer), tokenizer, journal=Journal(path))

        async def go():
            runner, url_ = await start_server(adapter)
            try:
                await converse(url_, "s1", "go", 2)
            finally:
                await runner.cleanup()

        asyncio.run(go())
        adapter.journal.close()  # the process ends
        # Restarted for a model of another shape.
        other = Adapter(
            engine=SGLangEngine(url, tokenizer),
            tokenizer=tokenizer,
            manager=TrajectoryManager(routing=RoutingShape(6, 2, 16)),
            config=AdapterConfig(routed_experts=True),
            journal=Journal(path),
        )
        return asyncio.run(other.finish_trajectory("s1"))

    mismatched = with_fake(fake, run)
    coverage = mismatched.ledger.replay["routed_experts"]
    assert coverage.missing == {"shape_mismatch": coverage.tokens} and coverage.tokens > 0


def test_audit_require_routing_fails_an_incomplete_batch(tokenizer, tmp_path, capsys) -> None:
    def finished(routing: KVRouting | None) -> dict:
        fake = FakeSGLang(text_reply(tokenizer), routing=routing)
        traj = with_fake(
            fake,
            lambda url: session(adapter_for(SGLangEngine(url, tokenizer), tokenizer), ("go", 2)),
        )
        return {"ledger": traj.ledger.to_dict()}

    complete, incomplete = finished(KVRouting(SHAPE)), finished(None)
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text(json.dumps(complete) + "\n")
    bad.write_text(json.dumps(complete) + "\n" + json.dumps(incomplete) + "\n")
    assert cli.main(["audit", str(good), "--require-routing", "--max-masked", "1"]) == 0
    assert "routed_experts" in capsys.readouterr().out
    assert cli.main(["audit", str(bad), "--require-routing", "--max-masked", "1"]) == 1
    out = capsys.readouterr().out
    assert "engine_returned_none=" in out and "FAIL: replay rows are incomplete" in out
    # Without the flag the gate is the masked fraction alone.
    assert cli.main(["audit", str(bad), "--max-masked", "1"]) == 0


def test_serve_reads_the_shapes_from_the_model_config(tmp_path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8})
    )

    def parse(argv: list[str]) -> ServeSettings:
        return resolve_settings(cli.build_parser().parse_args(argv), environ={})

    args = parse(["serve", "--routed-experts", "--model-config", str(tmp_path)])
    assert replay_shapes(args) == (RoutingShape(48, 8, 128), None)
    args = parse(["serve", "--routed-experts", "--routing-shape", "2,1,4"])
    assert replay_shapes(args) == (RoutingShape(2, 1, 4), None)
    assert replay_shapes(parse(["serve"])) == (None, None)
    with pytest.raises(SettingError, match="need the model's shape"):
        replay_shapes(parse(["serve", "--routed-experts"]))
    with pytest.raises(SettingError, match="has no indexer top-k"):
        replay_shapes(parse(["serve", "--indexer-topk", "--model-config", str(tmp_path)]))


# --- the property, over random sessions -------------------------------------------------------

MESSAGES = [system("s"), user("do it"), user("do that"), tool("ok"), tool("fail")]


@st.composite
def sessions(draw: st.DrawFn) -> list[tuple[list[dict], dict, int | None]]:
    """Turns that continue an earlier conversation, branch off or start anew; some prompts
    re-render a token (a drift), so not every prompt continues what its parent held."""
    convos: list[list[dict]] = []
    turns = []
    for k in range(draw(st.integers(1, 8))):
        if convos and draw(st.booleans()):
            history = list(draw(st.sampled_from(convos)))
        else:
            history = [draw(st.sampled_from(MESSAGES[:3]))]
        reply = assistant(f"r{k}" + "x" * draw(st.integers(0, 6)))
        drift = draw(st.none() | st.integers(0, 10_000))
        turns.append((history, reply, drift))
        convos.append([*history, reply, draw(st.sampled_from(MESSAGES[1:]))])
    return turns


@given(turns=sessions())
def test_every_sample_token_carries_what_the_request_that_computed_it_reported(turns) -> None:
    for backend in ("rust", "python"):
        kv = KVRouting(SHAPE)
        manager = TrajectoryManager(backend=backend, routing=SHAPE)
        reported: list[dict[int, list]] = []
        for tag, (history, reply, drift) in enumerate(turns):
            prompt = prompt_ids(history)
            if drift is not None:
                prompt[drift % len(prompt)] = 7
            output = sampled(reply)
            start = manager.replay_start("s", history, prompt, None)
            rows, _ = kv.serve(prompt, output, start, tag)
            reported.append({start + i: row.tolist() for i, row in enumerate(rows)})
            manager.record_turn(
                "s",
                turn=TurnRecord(prompt, output, "stop", routed_experts=ReplayRows(rows, start)),
                prompt_messages=history,
                response_message=reply,
            )
        traj = manager.finish("s")
        assert traj.ledger.replay["routed_experts"].complete
        for sample in traj.samples:
            _, computed_by = kv.rows_of(sample.tokens)
            for i in range(len(sample.tokens) - 1):
                tag = int(computed_by[i])
                assert sample.routed_experts[i].tolist() == reported[tag][i], (backend, i)
