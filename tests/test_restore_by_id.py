"""Restore by identity: an echo whose tool calls carry the ids we minted for the session, to the
same tools, is our call whatever the harness did to its arguments; one whose id or tool changed
is not. Claude Code 2.1.332 drops a `cd <its own directory> && ` from the Bash commands it
echoes: through the adapter, over each protocol's wire, the session stays one sample."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from hypothesis import given, settings
from hypothesis import strategies as st

from tokens import LOGPROB, prompt_ids, sampled, system, tool, user
from tokentrail import TrajectoryManager
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.messages import Conversation
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.read import read_journal
from tokentrail.storage.replay import Settings, as_recorded, replay
from tokentrail.trajectory.pipeline import TurnPipeline
from tokentrail.trajectory.turn import TurnRecord

BASH = {
    "type": "function",
    "function": {
        "name": "Bash",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout": {"type": "number", "default": 120000},
            },
            "required": ["command"],
        },
    },
}
READ = {
    "type": "function",
    "function": {
        "name": "Read",
        "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}}},
    },
}
TOOLS = [BASH, READ]
NAMES = ("Bash", "Read")

# -- the property ---------------------------------------------------------------------------------

texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
arguments = st.dictionaries(st.sampled_from(["command", "file_path", "flag"]), texts, min_size=1)


def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": args}}


@st.composite
def sessions(draw: st.DrawFn) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Turns of one call each: (tool, the arguments generated, the arguments the harness
    echoes), the echo differing in a value, a key dropped or a key added."""
    turns = []
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(NAMES))
        args = draw(arguments)
        how = draw(st.sampled_from(["value", "drop", "add"]))
        key = draw(st.sampled_from(sorted(args)))
        echoed = dict(args)
        if how == "value":
            echoed[key] = args[key] + draw(st.sampled_from(["x", " &&", "\u00e9"]))
        elif how == "drop" and len(args) > 1:
            del echoed[key]
        else:
            echoed["added"] = draw(texts)
        turns.append((name, args, echoed))
    return turns


def play_session(
    turns: list[tuple[str, dict[str, Any], dict[str, Any]]],
    tamper: int | None = None,
    tampered: str = "id",
    by_id: bool = True,
) -> tuple[Any, list[bool]]:
    """Each turn: restore what the harness sends, record the generated call (its id minted
    here), then the harness appends its echo with the id we sent (changed at `tamper`: its id,
    or its tool's name) and the result. Returns the trajectory and, per echo, whether the
    conversation the engine saw held the generated message in its place."""
    manager = TrajectoryManager()
    pipeline = TurnPipeline(manager, None, restore_by_id=by_id)
    harness = [system("you run commands"), user("do it")]
    call_ids: dict[int, tuple[str, ...]] = {}
    generated_at: list[tuple[int, dict[str, Any]]] = []
    for k, (name, args, echoed) in enumerate(turns):
        conversation = Conversation(list(harness), TOOLS, call_ids=dict(call_ids))
        messages = pipeline.restored("s", conversation).render
        reply = {"role": "assistant", "content": "", "tool_calls": [call(name, args)]}
        output = sampled(reply)
        minted = f"toolu_{k:04d}"
        manager.record_turn(
            "s",
            turn=TurnRecord(prompt_ids(messages), output, "stop", [LOGPROB] * len(output)),
            prompt_messages=messages,
            response_message=reply,
            metadata={"call_ids": [minted]},
            tools=TOOLS,
        )
        generated_at.append((len(harness), reply))
        sent_id, sent_name = minted, name
        if k == tamper:
            if tampered == "id":
                sent_id = f"toolu_other{k}"
            else:
                sent_name = "Read" if name == "Bash" else "Bash"
        call_ids[len(harness)] = (sent_id,)
        echo = {"role": "assistant", "content": "", "tool_calls": [call(sent_name, echoed)]}
        harness = [*harness, echo, tool(f"result {k}")]
    final = pipeline.restored("s", Conversation(list(harness), TOOLS, call_ids=call_ids)).render
    held = [final[at] == reply for at, reply in generated_at]
    return manager.finish("s"), held


@settings(deadline=None)
@given(turns=sessions())
def test_a_rewritten_echo_with_our_ids_splices_with_no_fork(turns) -> None:
    trajectory, held = play_session(turns)
    assert all(held)
    assert len(trajectory.samples) == 1
    assert trajectory.ledger.trained_tokens == trajectory.ledger.generated_tokens
    counted = sum(n for kinds in trajectory.ledger.restored_by_id.values() for n in kinds.values())
    # Every echo rewrote its call; the declared default `timeout` aside, none is a coarse echo.
    assert counted == len(turns)
    assert set(trajectory.ledger.restored_by_id) <= set(NAMES)
    assert all(set(kinds) == {"arguments"} for kinds in trajectory.ledger.restored_by_id.values())


@settings(deadline=None)
@given(turns=sessions(), data=st.data())
def test_an_echo_with_another_id_or_tool_is_not_restored(turns, data) -> None:
    tamper = data.draw(st.integers(0, len(turns) - 1))
    tampered = data.draw(st.sampled_from(["id", "name"]))
    trajectory, held = play_session(turns, tamper, tampered)
    assert not held[tamper]
    assert held[:tamper] == [True] * tamper
    # The turns after the tampered echo hang from the harness's version: another sample.
    if tamper < len(turns) - 1:
        assert len(trajectory.samples) == 2


@settings(deadline=None)
@given(turns=sessions())
def test_with_restore_by_id_off_a_rewritten_echo_is_not_restored(turns) -> None:
    _, held = play_session(turns, by_id=False)
    assert not any(held)


# -- through the adapter --------------------------------------------------------------------------

COMMAND = "cd /repo && echo HI > hi.txt"
ECHOED = "echo HI > hi.txt"
SCRIPT = [
    [{"type": "tool_use", "name": "Bash", "input": {"command": COMMAND}}],
    [{"type": "text", "text": "Wrote hi.txt."}],
]
ANTHROPIC_TOOLS = [
    {"name": "Bash", "description": "run", "input_schema": BASH["function"]["parameters"]}
]


def _anthropic(reply: dict | None) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "write HI to hi.txt"}]
    if reply is not None:
        (block,) = [b for b in reply["content"] if b["type"] == "tool_use"]
        echo = {**block, "input": {"command": ECHOED}}
        messages += [
            {"role": "assistant", "content": [echo]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": block["id"], "content": ""}],
            },
        ]
    return {"model": "m", "max_tokens": 64, "tools": ANTHROPIC_TOOLS, "messages": messages}


def _chat(reply: dict | None) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "write HI to hi.txt"}]
    if reply is not None:
        (sent,) = reply["choices"][0]["message"]["tool_calls"]
        echo = {
            **sent,
            "function": {**sent["function"], "arguments": json.dumps({"command": ECHOED})},
        }
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [echo]},
            {"role": "tool", "tool_call_id": sent["id"], "content": ""},
        ]
    return {"model": "m", "max_tokens": 64, "tools": [BASH], "messages": messages}


def _responses(reply: dict | None) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "write HI"}]
    if reply is not None:
        (sent,) = [i for i in reply["output"] if i["type"] == "function_call"]
        echo = {k: sent[k] for k in ("type", "call_id", "name")}
        items += [
            {**echo, "arguments": json.dumps({"command": ECHOED})},
            {"type": "function_call_output", "call_id": sent["call_id"], "output": ""},
        ]
    tools = [{"type": "function", "name": "Bash", "parameters": BASH["function"]["parameters"]}]
    return {"model": "m", "max_output_tokens": 64, "tools": tools, "input": items}


WIRES = {
    "/v1/messages": _anthropic,
    "/v1/chat/completions": _chat,
    "/v1/responses": _responses,
}


def _session(tokenizer, path: str, by_id: bool, journal: Path | None = None) -> Any:
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer, SCRIPT),
        tokenizer=tokenizer,
        config=AdapterConfig(restore_by_id=by_id, verify_resume=True),
        journal=Journal(journal) if journal is not None else None,
    )
    body = WIRES[path]

    async def main() -> Any:
        runner, url = await start_server(adapter)
        try:
            async with aiohttp.ClientSession() as http:
                reply = None
                for _ in range(2):
                    async with http.post(
                        url + path, json=body(reply), headers={"Authorization": "Bearer s"}
                    ) as resp:
                        assert resp.status == 200, await resp.text()
                        reply = await resp.json()
            return await adapter.finish_trajectory("s")
        finally:
            await runner.cleanup()
            if adapter.journal is not None:
                adapter.journal.close()

    return asyncio.run(main())


def test_a_bash_echo_without_its_cd_restores_by_id_over_every_protocol(tokenizer) -> None:
    for path in WIRES:
        trajectory = _session(tokenizer, path, by_id=True)
        ledger = trajectory.ledger
        assert len(trajectory.samples) == 1, path
        assert [t.history for t in ledger.turns] == ["render", "splice"], path
        assert ledger.trained_tokens == ledger.generated_tokens, path
        assert ledger.restored_by_id == {"Bash": {"arguments": 1}}, path
        assert ledger.to_dict()["restored_by_id"] == {"Bash": {"arguments": 1}}
        # The model's later context holds the command it sampled, not the harness's.
        text = tokenizer.decode(list(trajectory.samples[0].tokens))
        assert text.count(COMMAND) == 1 and "cd /repo" in text, path
        # Off, the same session forks at the rewritten echo.
        off = _session(tokenizer, path, by_id=False)
        assert len(off.samples) == 2 and off.ledger.restored_by_id == {}, path


def test_a_journaled_restore_by_id_replays_to_the_same_samples(tokenizer, tmp_path: Path) -> None:
    # The ids are not in the journaled messages: the turn's tags keep them (`echo_ids`), so
    # recovery and `tokentrail replay` restore the same echo again.
    journal = tmp_path / "run.db"
    live = _session(tokenizer, "/v1/messages", by_id=True, journal=journal)
    contents = read_journal(journal)
    for again in (
        as_recorded(contents)["s"],
        replay(contents, Settings.recorded(contents.meta), tokenizer)["s"],
    ):
        assert [s.to_dict() for s in again.samples] == [s.to_dict() for s in live.samples]
        assert again.ledger.restored_by_id == {"Bash": {"arguments": 1}}
