"""The OpenAI Responses API (`/v1/responses`): translation of Codex's real request, the official
`openai` SDK against the adapter (streamed and not), free-form and namespaced tools, and
`previous_response_id` served from the session's own tree."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from support import fixtures
from tokentrail.adapter import Adapter, start_server
from tokentrail.adapter.protocols.responses import read_tools, translate_request
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.errors import RequestError
from tokentrail.sim.codex import CODEX_FILES, CODEX_SCRIPT, CODEX_TOOLS, CodexWorkspace
from tokentrail.sim.harness import Behaviour, HarnessSim

TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
    {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch."},
    {
        "type": "namespace",
        "name": "agents",
        "description": "Sub-agents.",
        "tools": [
            {
                "type": "function",
                "name": "spawn",
                "parameters": {"type": "object", "properties": {"task": {"type": "string"}}},
            }
        ],
    },
    {"type": "web_search"},
]
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+x   \n*** End Patch\n"
SCRIPT = [
    [
        {"type": "thinking", "thinking": "Look, then patch."},
        {"type": "text", "text": "Working on it."},
        {"type": "tool_use", "name": "exec_command", "input": {"cmd": "ls"}},
        {"type": "tool_use", "name": "apply_patch", "input": {"input": PATCH}},
        {"type": "tool_use", "name": "agents.spawn", "input": {"task": "review"}},
    ],
    [{"type": "text", "text": "All done."}],
    [{"type": "text", "text": "Nothing else to do."}],
]


def run(coro):
    return asyncio.run(coro)


def _fixture() -> dict:
    return fixtures.load(fixtures.CODEX)


def test_codex_request_translates_items_tools_and_output_order() -> None:
    body = _fixture()["body"]
    conversation, tools = translate_request(body)
    messages = conversation.messages
    # Both leading developer messages are the system prompt; environment and task are users.
    assert [m["role"] for m in messages[:3]] == ["system", "user", "user"]
    assert messages[2]["content"] == "Tidy calc.py and util.py and add tests"
    # Items of one response are one assistant message; each output follows in call order.
    first = messages[3]
    assert first["reasoning_content"] == "<redacted: 23 chars>"  # encrypted_content first
    assert first["content"] == "Looking around."
    assert [c["function"]["name"] for c in first["tool_calls"]] == ["exec_command"]
    roles = [m["role"] for m in messages]
    assert roles.count("tool") == sum(
        1 for i in body["input"] if i["type"] in ("function_call_output", "custom_tool_call_output")
    )
    patch_calls = [
        c
        for m in messages
        for c in m.get("tool_calls", [])
        if c["function"]["name"] == "apply_patch"
    ]
    assert patch_calls and all(set(c["function"]["arguments"]) == {"input"} for c in patch_calls)
    # apply_patch is offered as a one-string function; web_search and tool_search are withheld.
    names = [t["function"]["name"] for t in conversation.tools or []]
    assert "apply_patch" in names and tools.custom == {"apply_patch"}
    assert sorted(tools.withheld) == ["tool_search", "web_search"]


def test_tool_outputs_are_ordered_as_the_calls_and_must_answer_one() -> None:
    call = {"type": "function_call", "name": "exec_command", "arguments": "{}"}
    body = {
        "input": [
            {"role": "user", "content": "go"},
            {**call, "call_id": "a", "arguments": '{"cmd": "slow"}'},
            {**call, "call_id": "b", "arguments": '{"cmd": "fast"}'},
            {"type": "function_call_output", "call_id": "b", "output": "fast done"},
            {"type": "function_call_output", "call_id": "a", "output": "slow done"},
        ]
    }
    messages = translate_request(body)[0].messages
    assert [m["content"] for m in messages[2:]] == ["slow done", "fast done"]
    body["input"].append({"type": "function_call_output", "call_id": "zzz", "output": "?"})
    with pytest.raises(RequestError, match="zzz"):
        translate_request(body)
    with pytest.raises(RequestError, match="unsupported input item type"):
        translate_request({"input": [{"type": "mystery"}]})
    with pytest.raises(RequestError, match="unsupported tool type"):
        read_tools([{"type": "telepathy"}])


def test_the_sdk_round_trips_calls_reasoning_and_continues_a_response(tokenizer) -> None:
    async def body() -> None:
        adapter = Adapter(engine=ScriptedEngine(tokenizer, SCRIPT), tokenizer=tokenizer)
        runner, url = await start_server(adapter)
        try:
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="s1", max_retries=0)
            first = await client.responses.create(
                model="m",
                input="fix it",
                tools=TOOLS,
                store=False,
                include=["reasoning.encrypted_content"],
            )
            kinds = [o.type for o in first.output]
            assert kinds == [
                "reasoning",
                "message",
                "function_call",
                "custom_tool_call",
                "function_call",
            ]
            reasoning, _, shell, patch, spawn = first.output
            assert reasoning.encrypted_content == "Look, then patch."
            assert json.loads(shell.arguments) == {"cmd": "ls"}
            assert patch.input == PATCH and patch.name == "apply_patch"
            assert (spawn.namespace, spawn.name) == ("agents", "spawn")
            assert first.usage.output_tokens_details.reasoning_tokens > 0

            items = [o.model_dump(exclude_none=True) for o in first.output]
            outputs = [
                {"type": "function_call_output", "call_id": shell.call_id, "output": "a.txt"},
                {"type": "custom_tool_call_output", "call_id": patch.call_id, "output": "Done"},
                {"type": "function_call_output", "call_id": spawn.call_id, "output": "ok"},
            ]
            stream = await client.responses.create(
                model="m",
                input=[{"role": "user", "content": "fix it"}, *items, *reversed(outputs)],
                tools=TOOLS,
                stream=True,
            )
            events = [event async for event in stream]
            assert events[0].type == "response.created" and events[-1].type == "response.completed"
            second = events[-1].response
            assert second.output_text == "All done."
            # The replayed history was spliced: everything before the new outputs is cached.
            assert second.usage.input_tokens_details.cached_tokens == (
                first.usage.input_tokens + first.usage.output_tokens
            )
            third = await client.responses.create(
                model="m", input="anything else?", previous_response_id=second.id, tools=TOOLS
            )
            assert third.output_text == "Nothing else to do."
            with pytest.raises(openai.BadRequestError, match="unknown previous response"):
                await client.responses.create(model="m", input="x", previous_response_id="resp_0")
            counted = await client.post(
                "/responses/input_tokens", body={"input": "fix it"}, cast_to=dict
            )
            assert counted["input_tokens"] > 0
            trajectory = await adapter.finish_trajectory("s1")
        finally:
            await runner.cleanup()
        ledger = trajectory.ledger
        assert len(ledger.turns) == 3 and len(trajectory.samples) == 1
        assert ledger.trained_tokens == ledger.generated_tokens > 0

    run(body())


def test_a_codex_shaped_simulated_session_is_one_sample_fully_trained(tokenizer) -> None:
    async def body() -> None:
        adapter = Adapter(engine=ScriptedEngine(tokenizer, CODEX_SCRIPT[:6]), tokenizer=tokenizer)
        runner, url = await start_server(adapter)
        try:
            sim = await HarnessSim(
                url,
                "cx",
                protocol="responses",
                tools=CODEX_TOOLS,
                workspace=CodexWorkspace(dict(CODEX_FILES)),
                behaviour=Behaviour(rerender_echoes=False, system_notes=False),
            ).run("Space the sum in calc.py.")
            trajectory = await adapter.finish_trajectory("cx")
        finally:
            await runner.cleanup()
        assert sim.tool_calls == {"exec_command": 4, "apply_patch": 2}
        assert len(trajectory.samples) == 1
        assert trajectory.ledger.trained_tokens == trajectory.ledger.generated_tokens > 0

    run(body())


def test_errors_on_the_responses_route_use_the_openai_shape(tokenizer) -> None:
    async def body() -> None:
        adapter = Adapter(engine=ScriptedEngine(tokenizer, SCRIPT), tokenizer=tokenizer)
        runner, url = await start_server(adapter)
        try:
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="s2", max_retries=0)
            with pytest.raises(openai.BadRequestError) as info:
                await client.responses.create(model="m", input=[{"type": "mystery"}])
            assert info.value.body["message"].startswith("input[0]: unsupported input item")
        finally:
            await runner.cleanup()

    run(body())
