"""The viewer's JSON: its numbers are the ledger's, each token's colour adds up to the ledger's
counts (on generated sessions with drift, forks, sub-agents and truncation), and bad requests
get a JSON 4xx, the adapter's behind the admin token."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokens import assistant, play, prompt_ids, sampled, system, tool, user
from tokentrail import TrajectoryManager, TurnRecord
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.core.routing import ReplayRows, RoutingShape
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.errors import NotFound
from tokentrail.kinds import Fallback, History, ReplayGap, Restore
from tokentrail.sim.harness import HarnessSim, Workspace
from tokentrail.storage.export import write_samples
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.read import read_journal
from tokentrail.storage.journal.record import JournaledTurn
from tokentrail.storage.replay import as_recorded
from tokentrail.view.app import UI_PREFIX, standalone_app
from tokentrail.view.samples import SamplesSource
from tokentrail.view.sources import JournalSource
from tokentrail.view.view_model import FATES, SessionData, tree_view, turn_detail

ADMIN = "viewer-admin"
SYS, U1 = system("be brief"), user("fix it")
GAP = ReplayGap.ENGINE_RETURNED_NONE


def _record(tokenizer, path: Path, restore: str, policy: str, sessions: int = 2) -> None:
    """The scripted coding session served `sessions` times into a journal."""

    async def go() -> None:
        adapter = Adapter(
            engine=ScriptedEngine(tokenizer),
            tokenizer=tokenizer,
            manager=TrajectoryManager(rewrite_policy=policy),
            config=AdapterConfig(restore=Restore(restore), admin_token=ADMIN),
            journal=Journal(path),
        )
        runner, url = await start_server(adapter)
        try:
            async with aiohttp.ClientSession() as http:
                for k in range(sessions):
                    await HarnessSim(url, f"job-{k}", workspace=Workspace()).run("Fix it", http)
        finally:
            await runner.cleanup()
            adapter.journal.close()

    asyncio.run(go())


RECORDINGS = [("on", "fork"), ("off", "fork"), ("off", "merge"), ("tree_only", "fork")]


@pytest.mark.parametrize(("restore", "policy"), RECORDINGS)
def test_journal_view_is_the_journal_s_ledger(tokenizer, tmp_path: Path, restore, policy) -> None:
    path = tmp_path / "j.db"
    _record(tokenizer, path, restore, policy)
    recorded = as_recorded(read_journal(path))
    source = JournalSource(path)
    summaries = source.summaries()
    assert [s["sid"] for s in summaries] == list(recorded)
    for summary in summaries:
        sid, ledger = summary["sid"], recorded[summary["sid"]].ledger
        assert summary["generated"] == ledger.generated_tokens
        assert summary["trained"] == ledger.trained_tokens
        assert summary["masked"] == ledger.masked_tokens
        detail = source.detail(sid)
        assert detail["ledger"] == ledger.to_dict()
        shown = [n["turn_index"] for n in detail["tree"] if n["kind"] == "turn"]
        demoted = [i for n in detail["tree"] for i in n.get("demoted", [])]
        assert sorted(shown + demoted) == [t.turn_index for t in ledger.turns]
        for row in ledger.turns:
            turn = source.turn(sid, row.turn_index)
            assert turn["consistent"], (turn["fate_counts"], turn["ledger_counts"])
            assert len(turn["output"]["text"]) == row.generated  # the journal names its tokenizer
    if restore == "on":
        # Claude-Code-like echoes came back re-rendered: each restored one is shown beside it.
        echoes = [
            e
            for s in summaries
            for row in recorded[s["sid"]].ledger.turns
            for e in source.turn(s["sid"], row.turn_index)["echoes"]
        ]
        assert len(echoes) == sum(t.ledger.restored_echoes for t in recorded.values()) > 0


def _fates_of(mgr: TrajectoryManager, sid: str, limit: int) -> list[dict]:
    names = mgr.core.REPLAY_STATUS

    def read(root, store, trajectory, echoes):
        data = SessionData(sid, "live", root, store, trajectory, echoes)
        details = [turn_detail(data, t.turn_index, None, names) for t in trajectory.ledger.turns]
        return details, trajectory

    return mgr.inspect(sid, read, max_sample_tokens=limit)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_each_token_s_fate_adds_up_to_the_ledger(data) -> None:
    """On generated sessions: the per-token colours count what the ledger counts, turn by turn,
    and every token coloured trained is the turn's own token where a sample trains it."""
    mgr = TrajectoryManager()
    history = [SYS, U1]
    previous = (len(prompt_ids(history)), 0)
    for k in range(data.draw(st.integers(1, 6), label="turns")):
        reply = assistant("step " * data.draw(st.integers(1, 6)) + str(k), ("Edit", {"n": k}))
        prompt = prompt_ids(history)
        start, length = previous
        if k and length > 2 and data.draw(st.booleans(), label="drift"):
            # The harness re-renders the tail of the last output: two ids drift.
            at = start + data.draw(st.integers(1, length - 2))
            prompt[at : at + 2] = [999, 998]
        out = play(mgr, "s", history, reply, prompt=prompt)
        previous = (len(prompt), len(out))
        history = [*history, reply, tool(f"result {k}")]
        if data.draw(st.booleans(), label="sub-agent"):
            play(mgr, "s", [system("sub agent"), user(f"look up {k}")], assistant("x is 1"))
    limit = data.draw(st.sampled_from([0, 40, 90, 200]), label="max_sample_tokens")
    details, trajectory = _fates_of(mgr, "s", limit)
    for turn in details:
        assert turn["consistent"], (turn["fate_counts"], turn["ledger_counts"])
    by_turn = {t["turn_index"]: t for t in details}
    for sample, placed in zip(trajectory.samples, trajectory.placements, strict=True):
        start = sample.prompt_length
        for p in placed:
            turn = by_turn[p.turn_index]
            fates = np.asarray(turn["output"]["fates"][: p.end - p.start])
            mask = sample.loss_mask[p.start - start : p.end - start].astype(bool)
            # What this sample trains of the turn is coloured trained ...
            assert not (mask & (fates != FATES.index("trained"))).any()
            ids = np.asarray(turn["output"]["ids"][: p.end - p.start])
            # ... and is the turn's own sampled token.
            assert (sample.tokens[p.start : p.end][mask] == ids[mask]).all()


def test_api_errors_are_json_4xx_and_the_adapter_s_ui_wants_the_admin_token(
    tokenizer, tmp_path: Path
) -> None:
    path = tmp_path / "j.db"
    _record(tokenizer, path, "on", "fork", sessions=1)

    async def go() -> None:
        async with aiohttp.ClientSession() as http:
            runner = aiohttp.web.AppRunner(standalone_app(JournalSource(path)))
            await runner.setup()
            site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            try:
                async with http.get(f"{url}/") as r:
                    assert r.status == 200 and "static/app.js" in await r.text()
                for asset in ("app.js", "style.css"):
                    async with http.get(f"{url}/static/{asset}") as r:
                        assert r.status == 200 and len(await r.read()) > 1000
                for route, status in [
                    ("/api/sessions/nope", 404),
                    ("/api/sessions/job-0/turns/99", 404),
                    ("/api/sessions/job-0/turns/x", 400),
                    ("/static/../../etc/passwd", 404),
                ]:
                    async with http.get(url + route) as r:
                        assert r.status == status, route
                        assert (await r.json())["error"]["message"]
                async with http.get(f"{url}/api/sessions/job-0/turns/1") as r:
                    assert r.status == 200 and (await r.json())["consistent"]
            finally:
                await runner.cleanup()

            for token, status in [(None, 403), (ADMIN, 200)]:
                adapter = Adapter(
                    engine=ScriptedEngine(tokenizer),
                    tokenizer=tokenizer,
                    config=AdapterConfig(admin_token=token),
                )
                runner, url = await start_server(adapter)
                try:
                    await HarnessSim(url, "live", workspace=Workspace()).run("Fix it", http)
                    async with http.get(f"{url}{UI_PREFIX}/") as r:
                        assert r.status == 200  # the page holds no data
                    api = f"{url}{UI_PREFIX}/api/sessions"
                    async with http.get(api) as r:
                        assert r.status == (401 if token else 403)
                    async with http.get(api, headers={"Authorization": "Bearer wrong"}) as r:
                        assert r.status == (401 if token else 403)
                    headers = {"Authorization": f"Bearer {token}"} if token else {}
                    async with http.get(api, headers=headers) as r:
                        assert r.status == status
                        if token:
                            (live,) = (await r.json())["sessions"]
                    if token:
                        finish = f"{url}/tokentrail/sessions/live/finish"
                        async with http.post(finish, json={}, headers=headers) as r:
                            ledger = (await r.json())["ledger"]
                        # The live view's numbers were what finishing answers.
                        assert live["generated"] == ledger["generated_tokens"]
                        assert live["trained"] == ledger["trained_tokens"]
                        async with http.get(api, headers=headers) as r:
                            assert (await r.json())["sessions"] == []
                finally:
                    await runner.cleanup()

    asyncio.run(go())


def _turn(mgr: TrajectoryManager, sid: str, messages, reply, prompt, **fields) -> list[int]:
    output = sampled(reply)
    record = TurnRecord(prompt, output, "stop", [-0.5] * len(output), **fields)
    mgr.record_turn(sid, turn=record, prompt_messages=messages, response_message=reply)
    return output


def test_a_splice_fallback_shows_the_first_token_its_render_departs_at() -> None:
    mgr = TrajectoryManager()
    a1, a2 = assistant("look", ("Read", {"p": 1})), assistant("done")
    first = [SYS, U1]
    out1 = _turn(mgr, "s", first, a1, prompt_ids(first))
    second = [SYS, U1, a1, tool("x=1")]
    prompt2 = prompt_ids(second)
    departs = len(prompt_ids(first)) + len(out1) - 2  # the render re-tokenized 2 ids of turn 1
    prompt2[departs] = 777
    _turn(mgr, "s", second, a2, prompt2, history=History.RENDER, fallback=Fallback.NOT_PREFIX)
    details, _ = _fates_of(mgr, "s", 0)
    fallback = details[1]["fallback"]
    assert fallback["reason"] == "not_prefix" and fallback["at"] == departs
    assert fallback["previous"]["id"] == out1[-2] and fallback["rendered"]["id"] == 777
    assert details[1]["history"] == "splice_fallback:not_prefix"
    assert details[1]["prompt"]["shared"] == departs and details[0]["fallback"] is None


def test_each_output_token_carries_its_routing_status() -> None:
    shape = RoutingShape(4, 2, 16)
    mgr = TrajectoryManager(routing=shape)
    a1 = assistant("look", ("Read", {"p": 1}))
    prompt = prompt_ids([SYS, U1])
    assistant_ids = sampled(a1)
    n = len(prompt) + len(assistant_ids) - 1
    rows = ReplayRows(np.ones((n, 4, 2), dtype=np.uint8), 0)
    _turn(mgr, "s", [SYS, U1], a1, prompt, routed_experts=rows)
    a2 = assistant("done")
    second = [SYS, U1, a1, tool("x=1")]
    _turn(mgr, "s", second, a2, prompt_ids(second), routed_experts=ReplayRows.missing(GAP))
    details, _ = _fates_of(mgr, "s", 0)
    names = details[0]["replay_status"]
    first = [names[c] for c in details[0]["output"]["replay"]["routed_experts"]]
    # Every output token has its row but the last, which nothing is computed from.
    assert first == ["present"] * (len(assistant_ids) - 1) + ["final_token"]
    second_status = {names[c] for c in details[1]["output"]["replay"]["routed_experts"]}
    assert second_status <= {str(GAP), "final_token"} and str(GAP) in second_status


def test_exported_samples_are_shown_by_what_their_masks_train(tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    _record(tokenizer, path, "off", "merge")
    recorded = as_recorded(read_journal(path))
    exported = tmp_path / "done.jsonl"
    write_samples(exported, [s for t in recorded.values() for s in t.samples])
    source = SamplesSource(exported, tokenizer)
    summaries = {s["sid"]: s for s in source.summaries()}
    assert set(summaries) == set(recorded)
    for sid, trajectory in recorded.items():
        assert summaries[sid]["trained"] == trajectory.ledger.trained_tokens
        assert summaries[sid]["generated"] is None  # not in the file: not made up
        assert source.detail(sid)["ledger"] is None
        for i, sample in enumerate(trajectory.samples):
            shown = source.turn(sid, i)
            assert shown["output"]["ids"] == sample.tokens[sample.prompt_length :].tolist()
            assert shown["fate_counts"].get("trained", 0) == sample.trained_tokens
            assert "".join(shown["prompt"]["text"] + shown["output"]["text"]) == (
                tokenizer.decode(sample.tokens.tolist())
            )
        with pytest.raises(NotFound):
            source.turn(sid, len(trajectory.samples))


def _route(mgr: TrajectoryManager, messages, reply, **kwargs) -> None:
    output = sampled(reply)
    mgr.record_turn(
        "s",
        turn=TurnRecord(prompt_ids(messages), output, "stop", [-0.5] * len(output)),
        prompt_messages=messages,
        response_message=reply,
        **kwargs,
    )


def test_the_tree_labels_each_branch_with_why_it_branched() -> None:
    mgr = TrajectoryManager()
    brief = "Find every caller of add() in the repository and list them."
    a1 = assistant("delegating", ("Agent", {"prompt": brief}))
    _route(mgr, [SYS, U1], a1)
    main = [SYS, U1, a1, tool("3 callers")]
    a2 = assistant("fixing", ("Edit", {"n": 1}))
    _route(mgr, main, a2)
    # A retry answered fresh from the same prompt, then more turns built on it.
    a2b = assistant("fixing again", ("Edit", {"n": 2}))
    _route(mgr, main, a2b, supersede=True)
    # The harness edits the history (another tool result for turn 1): a rewritten branch.
    _route(mgr, [SYS, U1, a1, tool("2 callers")], assistant("ok"))
    # The sub-agent's own conversation, and a side conversation excluded from training.
    _route(mgr, [system("You are a search agent."), user(brief)], assistant("found 3"))
    side = [system("Summarize the conversation."), user("...")]
    _route(mgr, side, assistant("summary"), metadata={"excluded": "pattern:Summarize"})
    tree, ledger = _fates_of_tree(mgr)
    reasons = {n["turn_index"]: n["reason"] for n in tree if n["kind"] == "turn"}
    assert reasons[4] == "rewritten"
    assert reasons[5] == "subagent" and reasons[6] == "excluded"
    assert reasons[3] == "retry"
    assert {n["turn_index"] for n in tree if n["kind"] == "turn"} == {
        t.turn_index for t in ledger.turns
    }
    by_turn = {n["turn_index"]: n for n in tree if n["kind"] == "turn"}
    assert by_turn[6]["excluded"] == "pattern:Summarize" and by_turn[2]["superseded"]


def _fates_of_tree(mgr: TrajectoryManager):
    def read(root, store, traj, echoes):
        return tree_view(root, traj.ledger), traj.ledger

    return mgr.inspect("s", read)


def test_a_journal_being_written_is_read_again_as_it_grows(tmp_path: Path) -> None:
    """`tokentrail view` on the journal a running adapter appends to: new turns show up."""
    journal = Journal(tmp_path / "live.db")
    history = [SYS, U1]

    def turn(k: int) -> None:
        nonlocal history
        reply = assistant(f"step {k}", ("Edit", {"n": k}))
        output = sampled(reply)
        journal.turn(
            JournaledTurn(
                "s",
                translated=list(history),
                response_message=reply,
                tools=None,
                prompt_ids=prompt_ids(history),
                output_ids=output,
                logprobs=[-0.5] * len(output),
                finish_reason="stop",
                ill_formed=False,
                metadata={},
            )
        )
        history = [*history, reply, tool(f"result {k}")]

    try:
        turn(0)
        source = JournalSource(journal.path)
        (before,) = source.summaries()
        turn(1)
        turn(2)
        (after,) = source.summaries()
    finally:
        journal.close()
    assert (before["turns"], after["turns"]) == (1, 3)
    assert after["generated"] == after["trained"] > before["generated"]


SECURITY = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
}


def _secured(headers) -> None:
    for name, value in SECURITY.items():
        assert headers.get(name) == value, name
    csp = headers.get("Content-Security-Policy", "")
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp


def test_view_needs_its_printed_token_and_a_host_it_is_served_under(
    tokenizer, tmp_path: Path
) -> None:
    """`tokentrail view` prints its URL with a token; without it the page and the API are a
    401, with it (query, then the cookie it sets, or a bearer header) they answer; a request
    naming another Host (DNS rebinding) is a 403 even with the token; every response carries
    the security headers; listening beyond loopback warns, and without a token is refused."""
    import socket
    import subprocess
    import sys

    path = tmp_path / "j.db"
    _record(tokenizer, path, "on", "fork", sessions=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "tokentrail", "view", str(path), "--port", str(port)]
    refused = subprocess.run([*cmd, "--host", "0.0.0.0", "--no-token"], capture_output=True)
    assert refused.returncode == 2 and b"--no-token with --host 0.0.0.0" in refused.stderr
    view = subprocess.Popen(
        [*cmd, "--host", "0.0.0.0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert view.stdout is not None
        printed = view.stdout.readline()
        assert f"http://localhost:{port}/?token=" in printed
        token = printed.split("?token=", 1)[1].split()[0]
        assert len(token) >= 32
        asyncio.run(_probe_view(f"http://127.0.0.1:{port}", token))
    finally:
        view.terminate()
        _, err = view.communicate(timeout=30)
    assert "listens on 0.0.0.0: reachable from the network" in err


async def _probe_view(url: str, token: str) -> None:
    # A browser keeps a cookie of a page opened by address; aiohttp only when told to.
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        for route in ("/", "/api/sessions", "/static/app.js"):
            async with http.get(url + route) as r:
                assert r.status == 401, route
                assert "token" in (await r.json())["error"]["message"]
                _secured(r.headers)
        async with http.get(f"{url}/api/sessions?token=wrong") as r:
            assert r.status == 401
        evil = {"Host": f"attacker.example:{url.rsplit(':', 1)[1]}"}
        async with http.get(f"{url}/api/sessions?token={token}", headers=evil) as r:
            assert r.status == 403 and "DNS rebinding" in (await r.json())["error"]["message"]
            _secured(r.headers)
        # The printed URL: the page, and a cookie that opens the rest.
        async with http.get(f"{url}/?token={token}") as r:
            assert r.status == 200 and "static/app.js" in await r.text()
            _secured(r.headers)
            cookie = r.cookies["tokentrail_view"]
            assert cookie["httponly"] and cookie["samesite"] == "Strict"
        async with http.get(f"{url}/api/sessions") as r:
            assert r.status == 200 and len((await r.json())["sessions"]) == 1
            _secured(r.headers)
    async with aiohttp.ClientSession() as fresh:
        bearer = {"Authorization": f"Bearer {token}"}
        async with fresh.get(f"{url}/api/sessions", headers=bearer) as r:
            assert r.status == 200
        async with fresh.get(f"{url}/api/sessions", headers={**bearer, "Host": "localhost"}) as r:
            assert r.status == 200


def test_the_adapters_ui_sends_the_security_headers(tokenizer) -> None:
    async def go() -> None:
        adapter = Adapter(
            engine=ScriptedEngine(tokenizer),
            tokenizer=tokenizer,
            config=AdapterConfig(admin_token=ADMIN),
        )
        runner, url = await start_server(adapter)
        try:
            async with aiohttp.ClientSession() as http:
                bearer = {"Authorization": f"Bearer {ADMIN}"}
                for route in ("/", "/static/app.js", "/static/style.css", "/api/sessions"):
                    async with http.get(f"{url}{UI_PREFIX}{route}", headers=bearer) as r:
                        assert r.status == 200, route
                        _secured(r.headers)
        finally:
            await runner.cleanup()

    asyncio.run(go())
