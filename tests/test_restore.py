"""Echo restore: a harness's re-rendered echo is replaced by the message the model generated."""

from __future__ import annotations

import copy
import json

import pytest

from support import fixtures
from tokens import assistant, play, prompt_ids, system, tool, user
from tokentrail import TrajectoryManager
from tokentrail.adapter.protocols.anthropic import assistant_message, translate_request
from tokentrail.kinds import Restore
from tokentrail.messages import Conversation
from tokentrail.trajectory.pipeline import TurnPipeline


def schema(name: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


EDIT = schema(
    "Edit",
    {
        "file_path": {"type": "string"},
        "old_string": {"type": "string"},
        "new_string": {"type": "string"},
        "replace_all": {"type": "boolean", "default": False},
    },
    ["file_path", "old_string", "new_string"],
)
WRITE = schema(
    "Write", {"file_path": {"type": "string"}, "content": {"type": "string"}}, ["file_path"]
)
GREP = schema(
    "Grep",
    {"pattern": {"type": "string"}, "case_sensitive": {"type": "boolean", "default": True}},
    ["pattern"],
)
TOOLS = [EDIT, WRITE, GREP]

SYS = system("you edit code")
U = user("fix calc.py")
EDIT_CALL = assistant(
    "Fixing.  ",
    ("Edit", {"file_path": "calc.py", "old_string": "a+b   \n", "new_string": "# sum   \na + b\n"}),
)
EDIT_ECHO = assistant(
    "Fixing.  ",
    (
        "Edit",
        {
            "replace_all": False,
            "file_path": "calc.py",
            "old_string": "a+b   \n",
            "new_string": "# sum\na + b\n",
        },
    ),
)
WRITE_CALL = assistant("", ("Write", {"file_path": "u.py", "content": "def f():   \n  pass \t\n"}))
WRITE_ECHO = assistant("", ("Write", {"file_path": "u.py", "content": "def f():\n  pass\n"}))


def restored(mgr: TrajectoryManager, messages: list[dict], tools=TOOLS) -> list[dict]:
    return mgr.restore_generated_messages("s", messages, tools)


def test_edit_echo_with_both_edits_is_restored(backend: str) -> None:
    mgr = TrajectoryManager(backend=backend)
    play(mgr, "s", [SYS, U], EDIT_CALL)
    incoming = [SYS, U, EDIT_ECHO, tool("ok")]
    snapshot = copy.deepcopy(incoming)
    out = restored(mgr, incoming)
    assert out[2] == EDIT_CALL and out[2] is not EDIT_CALL
    assert incoming == snapshot  # the caller's list and dicts are untouched
    assert out[3] is incoming[3]
    play(mgr, "s", out, assistant("done"))
    traj = mgr.finish("s")
    (sample,) = traj.samples
    turn1 = traj.ledger.turns[0]
    assert turn1.tools == ["Edit"] and turn1.trained == turn1.generated > 0
    assert traj.ledger.restored_echoes == 1 and traj.ledger.restored_by_tool == {"Edit": 1}
    assert traj.drift_counts == {"clean": 1}


def test_write_echo_stripped_per_line_is_restored() -> None:
    mgr = TrajectoryManager()
    play(mgr, "s", [SYS, U], WRITE_CALL)
    assert restored(mgr, [SYS, U, WRITE_ECHO])[2] == WRITE_CALL


@pytest.mark.parametrize(
    "filled, expected",
    [(True, True), (False, False)],
)
def test_true_default(filled: bool, expected: bool) -> None:
    mgr = TrajectoryManager()
    call = assistant("", ("Grep", {"pattern": "x"}))
    play(mgr, "s", [SYS, U], call)
    echo = assistant("", ("Grep", {"pattern": "x", "case_sensitive": filled}))
    assert (restored(mgr, [SYS, U, echo])[2] == call) is expected


@pytest.mark.parametrize("filled, expected", [(False, True), (True, False)])
def test_false_default(filled: bool, expected: bool) -> None:
    mgr = TrajectoryManager()
    call = assistant("", ("Edit", {"file_path": "a", "old_string": "x", "new_string": "y"}))
    play(mgr, "s", [SYS, U], call)
    echo = assistant(
        "",
        ("Edit", {"file_path": "a", "old_string": "x", "new_string": "y", "replace_all": filled}),
    )
    assert (restored(mgr, [SYS, U, echo])[2] == call) is expected


def test_without_schema_only_whitespace_echoes_restore() -> None:
    mgr = TrajectoryManager()
    play(mgr, "s", [SYS, U], EDIT_CALL)
    assert restored(mgr, [SYS, U, EDIT_ECHO], tools=None)[2] == EDIT_ECHO
    whitespace_only = copy.deepcopy(EDIT_ECHO)
    del whitespace_only["tool_calls"][0]["function"]["arguments"]["replace_all"]
    assert restored(mgr, [SYS, U, whitespace_only], tools=None)[2] == EDIT_CALL


def _edit(**changes) -> dict:
    args = {"file_path": "calc.py", "old_string": "a+b   \n", "new_string": "# sum\na + b\n"}
    args.update(changes)
    return assistant("Fixing.  ", ("Edit", args))


@pytest.mark.parametrize(
    "echo",
    [
        _edit(old_string="a-b   \n"),
        _edit(file_path="other.py"),
        assistant("Fixing.  ", ("Write", {"file_path": "calc.py", "content": "# sum\na + b\n"})),
        assistant("Fixing.  Edit calc.py"),
        _edit(new_string="  # sum\na + b\n"),
        assistant(
            "Fixing.  ",
            ("Edit", {"file_path": "calc.py", "old_string": "a+b   \n", "new_string": "#sum\n"}),
        ),
        assistant(
            "Fixing.  ",
            (
                "Edit",
                {"file_path": "calc.py", "old_string": "a+b   \n", "new_string": "# sum\na + b\n"},
            ),
            ("Write", {"file_path": "x", "content": ""}),
        ),
        assistant("Fixing.  "),
        {**_edit(), "reasoning_content": "hmm"},
        _edit(replace_all=True),
    ],
    ids=[
        "old_string",
        "file",
        "tool",
        "text",
        "leading-ws",
        "payload",
        "extra-call",
        "missing-call",
        "reasoning",
        "non-default",
    ],
)
def test_rejections_are_not_restored(echo: dict) -> None:
    mgr = TrajectoryManager()
    play(mgr, "s", [SYS, U], EDIT_CALL)
    out = restored(mgr, [SYS, U, echo])
    assert out[2] is echo
    assert mgr.restored_echoes("s") == 0


def test_nested_defaults_and_payloads() -> None:
    nested = schema(
        "Patch",
        {
            "edits": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"text": {"type": "string"}, "fuzzy": {"default": 0}},
                },
            }
        },
        ["edits"],
    )
    mgr = TrajectoryManager()
    call = assistant("", ("Patch", {"edits": [{"text": "a  \nb"}]}))
    play(mgr, "s", [SYS, U], call)
    echo = assistant("", ("Patch", {"edits": [{"text": "a\nb", "fuzzy": 0}]}))
    assert mgr.restore_generated_messages("s", [SYS, U, echo], [nested])[2] == call
    other = assistant("", ("Patch", {"edits": [{"text": "a\nb", "fuzzy": 2}]}))
    assert mgr.restore_generated_messages("s", [SYS, U, other], [nested])[2] is other


def test_every_earlier_echo_in_a_long_history_is_restored(backend: str) -> None:
    """Five turns along the adapter's path, every echo rewritten: all train, one sample."""
    calls = [
        (EDIT_CALL, EDIT_ECHO),
        (WRITE_CALL, WRITE_ECHO),
        (
            assistant("", ("Edit", {"file_path": "b", "old_string": "x", "new_string": "y \n"})),
            assistant(
                "",
                (
                    "Edit",
                    {
                        "file_path": "b",
                        "old_string": "x",
                        "new_string": "y\n",
                        "replace_all": False,
                    },
                ),
            ),
        ),
        (
            assistant("", ("Write", {"file_path": "c.py", "content": "z = 1   \n"})),
            assistant("", ("Write", {"file_path": "c.py", "content": "z = 1\n"})),
        ),
        (assistant("All done.  "), None),
    ]
    results = {}
    for restore in (True, False):
        mgr = TrajectoryManager(backend=backend, rewrite_policy="merge")
        harness = [SYS, U]  # what the harness sends: echoes rewritten
        for k, (generated, echo) in enumerate(calls):
            mode = Restore.ON if restore else Restore.OFF
            pipeline = TurnPipeline(mgr, None, restore=mode)
            messages = pipeline.restored("s", Conversation(harness, TOOLS)).render
            play(mgr, "s", messages, generated)
            harness = [*harness, echo or generated, tool(f"result {k}")]
        results[restore] = mgr.finish("s")
    on, off = results[True], results[False]
    assert len(on.samples) == 1
    assert on.ledger.trained_tokens == on.ledger.generated_tokens
    assert on.ledger.restored_echoes == 4
    assert on.ledger.restored_by_tool == {"Edit": 2, "Write": 2}
    assert all(t.trained == t.generated for t in on.ledger.turns)
    # Without restore the same session loses those turns to merges.
    assert off.ledger.trained_tokens < off.ledger.generated_tokens
    assert off.ledger.masked_tokens.get("merged_rewrite", 0) > 0


def _fixture() -> dict:
    return fixtures.load(fixtures.CLAUDE_CODE)


def test_real_claude_code_fixture_replayed(backend: str) -> None:
    fixture = _fixture()
    mgr = TrajectoryManager(backend=backend)
    generated: list[dict] = []
    byte_different = 0
    for i, exchange in enumerate(fixture["exchanges"]):
        translated = translate_request(exchange["request"])
        messages = TurnPipeline(mgr, None).restored("cc", translated).render
        sent = [m for m in translated.messages if m["role"] == "assistant"]
        got = [m for m in messages if m["role"] == "assistant"]
        assert got == generated, f"exchange {i}"
        byte_different += sum(a != b for a, b in zip(sent, generated, strict=True))
        reply, _ = assistant_message(exchange["reply_content"])
        play(mgr, "cc", messages, reply)
        generated.append(reply)
    # Claude Code rewrote the Edit and the util.py Write in every later request.
    assert byte_different == 4 + 3
    traj = mgr.finish("cc")
    assert traj.ledger.restored_by_tool == {"Edit": 1, "Write": 1}
    by_tool = traj.ledger.by_tool
    for name in ("Edit", "Write", "Bash"):
        assert by_tool[name]["turns_trained"] == by_tool[name]["turns"] > 0
    assert traj.ledger.trained_tokens == traj.ledger.generated_tokens
    assert len(traj.samples) == 1


def test_restore_on_unknown_session_is_a_copy() -> None:
    mgr = TrajectoryManager()
    msgs = [SYS, U]
    out = mgr.restore_generated_messages("nobody", msgs)
    assert out == msgs and out is not msgs


def test_prompt_ids_from_restored_messages_extend_the_held_tokens() -> None:
    mgr = TrajectoryManager()
    out1 = play(mgr, "s", [SYS, U], EDIT_CALL)
    messages = restored(mgr, [SYS, U, EDIT_ECHO, tool("ok")])
    held = prompt_ids([SYS, U]) + out1
    assert prompt_ids(messages)[: len(held)] == held
    assert prompt_ids([SYS, U, EDIT_ECHO, tool("ok")])[: len(held)] != held


# --- hermes-agent's replay, through the adapter -----------------------------------------------


def _hermes_replay(message: dict) -> dict:
    """An assistant reply as hermes-agent 0.19.0 sends it back: no reasoning, content stripped
    at both ends, arguments `json.dumps(..., separators=(",", ":"), sort_keys=True)`."""
    out = {"role": "assistant", "content": (message.get("content") or "").strip()}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                **call,
                "function": {
                    "name": call["function"]["name"],
                    "arguments": json.dumps(
                        json.loads(call["function"]["arguments"]),
                        separators=(",", ":"),
                        sort_keys=True,
                    ),
                },
            }
            for call in message["tool_calls"]
        ]
    return out


HERMES_SCRIPT = [
    [
        {"type": "thinking", "thinking": "  Let me write calc.py.  "},
        {"type": "text", "text": " I'll add mul()."},
        {
            "type": "tool_use",
            "name": "write_file",
            "input": {"path": "calc.py", "content": "def mul(a, b):\n    return a * b  # café\n"},
        },
    ],
    [{"type": "thinking", "thinking": "Done."}, {"type": "text", "text": "\nAdded mul().\n"}],
    [{"type": "thinking", "thinking": "Again."}, {"type": "text", "text": "Still fine."}],
]


@pytest.mark.parametrize("history", ["splice", "render"])
def test_a_hermes_session_is_one_sample_and_trains_everything(history: str) -> None:
    import asyncio

    import openai

    from tokentrail.adapter import Adapter, AdapterConfig, start_server
    from tokentrail.engines.scripted import ScriptedEngine
    from tokentrail.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer, HERMES_SCRIPT),
        tokenizer=tokenizer,
        config=AdapterConfig(history=history),
    )
    tools = [
        {
            "type": "function",
            "function": {
                "name": "write_file",
                "parameters": {
                    "type": "object",
                    "properties": {"content": {"type": "string"}, "path": {"type": "string"}},
                },
            },
        }
    ]

    async def go():
        runner, url = await start_server(adapter)
        try:
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="h", max_retries=0)
            messages: list[dict] = [
                {"role": "system", "content": "You are Hermes Agent."},
                {"role": "user", "content": "Add mul() to calc.py"},
            ]
            for step in range(3):
                reply = await client.chat.completions.create(
                    model="qwen3", messages=messages, tools=tools
                )
                messages.append(_hermes_replay(reply.choices[0].message.model_dump()))
                if step == 0:
                    call_id = reply.choices[0].message.tool_calls[0].id
                    messages.append({"role": "tool", "tool_call_id": call_id, "content": "ok"})
                else:
                    messages.append({"role": "user", "content": "[System: verify it.]"})
            return await adapter.finish_trajectory("h", reward=1.0)
        finally:
            await runner.cleanup()

    trajectory = asyncio.run(go())
    ledger = trajectory.ledger
    assert len(trajectory.samples) == 1
    assert ledger.trained_tokens == ledger.generated_tokens
    assert ledger.masked_tokens == {}
    # Both replies sent back came re-rendered, and both were restored.
    assert ledger.restored_echoes == 2
    assert ledger.restored_by_tool == {"write_file": 1}


def test_sorted_argument_keys_restore_the_generated_order() -> None:
    # Routing keys ignore key order; `tojson` does not: the tree's own dict is rendered.
    mgr = TrajectoryManager()
    call = assistant("", ("Write", {"file_path": "u.py", "content": "x"}))
    play(mgr, "s", [SYS, U], call)
    resorted = assistant("", ("Write", {"content": "x", "file_path": "u.py"}))
    out = restored(mgr, [SYS, U, resorted, tool("ok")])
    assert list(out[2]["tool_calls"][0]["function"]["arguments"]) == ["file_path", "content"]
    assert mgr.restored_echoes("s") == 1
    # An echo in the generated order is the generated message already: nothing to count.
    restored(mgr, [SYS, U, copy.deepcopy(call), tool("ok")])
    assert mgr.restored_echoes("s") == 1


def test_an_echo_that_matches_two_generated_messages_is_not_restored() -> None:
    mgr = TrajectoryManager()
    first = {**assistant("Same answer."), "reasoning_content": "one way"}
    second = {**assistant("Same answer."), "reasoning_content": "another way"}
    play(mgr, "s", [SYS, U], first)
    play(mgr, "s", [SYS, U], second)
    dropped = assistant("Same answer.")
    assert restored(mgr, [SYS, U, dropped, user("and?")])[2] == dropped
    assert restored(mgr, [SYS, U, {**dropped, "reasoning_content": "one way"}])[2] == first
