"""Translation from the wire into what the template renders, for the cases real harnesses send:
tool results in completion order, failed tool results, server tools and their history blocks,
tool choices, and media the template cannot show."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tokentrail.adapter.protocols import anthropic, openai
from tokentrail.adapter.protocols.options import WireOptions
from tokentrail.errors import RequestError
from tokentrail.kinds import ToolChoice
from tokentrail.text.chat_template import TOOL_ERROR_MARKER, render
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.text.vision import resolve_images

TEMPLATES = Path(__file__).parent / "templates"
READ = {"name": "Read", "input_schema": {"type": "object", "properties": {}}}
BASH = {"name": "Bash", "input_schema": {"type": "object", "properties": {}}}


def tool_use(call_id: str, path: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "Read", "input": {"file_path": path}}


def result(call_id: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": text, **extra}


def three_reads(*results: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 16,
        "tools": [READ],
        "messages": [
            {"role": "user", "content": "read three files"},
            {
                "role": "assistant",
                "content": [
                    tool_use("t_calc", "calc.py"),
                    tool_use("t_missing", "missing.py"),
                    tool_use("t_util", "util.py"),
                ],
            },
            {"role": "user", "content": list(results)},
        ],
    }


# --- tool results follow their calls ----------------------------------------------------------


def test_anthropic_tool_results_are_put_in_call_order() -> None:
    # Claude Code's completion order: the error first, then the fast read, then the slow one.
    body = three_reads(
        result("t_missing", "File does not exist.", is_error=True),
        result("t_util", "def mul(): ..."),
        result("t_calc", "def add(): ..."),
        {"type": "text", "text": "and then?"},
    )
    messages = anthropic.translate_request(body).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "tool", "user"]
    assert [m["content"] for m in messages[2:5]] == [
        "def add(): ...",
        "File does not exist.",
        "def mul(): ...",
    ]
    assert messages[3]["is_error"] is True and "is_error" not in messages[2]


def test_openai_tool_messages_are_put_in_call_order() -> None:
    def call(call_id: str) -> dict[str, Any]:
        return {"id": call_id, "type": "function", "function": {"name": "Read", "arguments": "{}"}}

    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call("c1"), call("c2")]},
            {"role": "tool", "tool_call_id": "c2", "content": "second"},
            {"role": "tool", "tool_call_id": "c1", "content": "first"},
            {"role": "user", "content": "next"},
        ],
    }
    messages = openai.translate_request(body).messages
    assert [m["content"] for m in messages[2:4]] == ["first", "second"]
    assert messages[4] == {"role": "user", "content": "next"}


def test_the_rendered_prompt_has_each_response_after_its_own_call() -> None:
    tokenizer = load_tokenizer()
    body = three_reads(
        result("t_missing", "MISSING"), result("t_util", "UTIL"), result("t_calc", "CALC")
    )
    text = render(tokenizer.chat_template, anthropic.translate_request(body).messages)
    assert text.index("calc.py") < text.index("missing.py") < text.index("util.py")
    assert text.index("CALC") < text.index("MISSING") < text.index("UTIL")


@pytest.mark.parametrize(
    "results",
    [
        pytest.param([result("t_other", "x")], id="unknown-id"),
        pytest.param([result("t_calc", "x"), result("t_calc", "y")], id="answered-twice"),
    ],
)
def test_a_result_for_no_open_call_is_refused_naming_its_id(results: list[dict]) -> None:
    with pytest.raises(RequestError, match="t_other|t_calc"):
        anthropic.translate_request(three_reads(*results))


# --- slime's readings (WireOptions), off unless asked for ---------------------------------------

BY_POSITION = WireOptions(results_by_position=True)


def _unnamed_reads(*results: dict[str, Any]) -> dict[str, Any]:
    """`three_reads`, its middle call sent without an id (slime's test sends such calls)."""
    body = three_reads(*results)
    del body["messages"][1]["content"][1]["id"]
    return body


def test_a_call_without_an_id_is_refused_by_default() -> None:
    body = _unnamed_reads(result("t_calc", "C"), result("t_missing", "M"), result("t_util", "U"))
    with pytest.raises(RequestError, match="'t_missing' has no matching tool call"):
        anthropic.translate_request(body)


def test_a_call_without_an_id_takes_the_next_result_naming_no_open_call() -> None:
    # Completion order; the unnamed call's result names an id no call has.
    body = _unnamed_reads(
        result("t_util", "U"), result("whatever", "M"), result("t_calc", "C"), {"type": "text",
        "text": "next"}
    )  # fmt: skip
    messages = anthropic.translate_request(body, BY_POSITION).messages
    assert [m["content"] for m in messages[2:]] == ["C", "M", "U", "next"]
    # Calls with ids are still answered by id: a second result for one is refused.
    twice = _unnamed_reads(result("t_calc", "C"), result("t_calc", "again"))
    with pytest.raises(RequestError, match="'t_calc' has no matching tool call"):
        anthropic.translate_request(twice, BY_POSITION)


def test_results_past_the_calls_without_ids_are_refused() -> None:
    body = _unnamed_reads(result("x", "M"), result("y", "extra"))
    with pytest.raises(RequestError, match="'y' has no matching tool call"):
        anthropic.translate_request(body, BY_POSITION)


def test_a_later_user_turn_closes_the_calls_without_ids() -> None:
    body = _unnamed_reads(result("x", "M"))
    body["messages"] += [
        {"role": "user", "content": "more"},
        {"role": "user", "content": [result("y", "late")]},
    ]
    with pytest.raises(RequestError, match="'y' has no matching tool call"):
        anthropic.translate_request(body, BY_POSITION)


def test_a_mid_list_system_message_as_text_or_as_slimes_reminder() -> None:
    body = {
        "model": "m",
        "max_tokens": 8,
        "system": "sys",
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "system", "content": [{"type": "text", "text": "skills list"}]},
            {"role": "user", "content": "next"},
        ],
    }
    assert anthropic.translate_request(body).messages[1:] == [
        {"role": "user", "content": "hello\n\nskills list"},
        {"role": "user", "content": "next"},
    ]
    reminder = anthropic.translate_request(body, WireOptions(system_reminder=True)).messages
    assert reminder == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hello"},
        {"role": "user", "content": "<system-reminder>\nskills list\n</system-reminder>\n"},
        {"role": "user", "content": "next"},
    ]


def _completion() -> dict[str, Any]:
    message = {"role": "assistant", "content": "hi"}
    return {"id": "c", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip


@pytest.mark.parametrize(
    ("options", "first"),
    [
        (WireOptions(), {"role": "assistant", "content": ""}),
        (WireOptions(bare_role_chunk=True), {"role": "assistant"}),
    ],
)
def test_the_role_chunk_of_a_chat_stream(options: WireOptions, first: dict[str, Any]) -> None:
    proto = openai.OpenAIChat().configured(options)
    frames = list(proto.stream(_completion(), {}))
    assert json.loads(frames[0].removeprefix(b"data: "))["choices"][0]["delta"] == first
    live = proto.live({}, "c", "m", 1).open()
    assert json.loads(live.removeprefix(b"data: "))["choices"][0]["delta"] == first
    # The registered instance keeps tokentrail's.
    assert openai.OpenAIChat().options == WireOptions()


# --- is_error ---------------------------------------------------------------------------------


@pytest.mark.parametrize("template", ["builtin", *sorted(p.name for p in TEMPLATES.iterdir())])
def test_a_failed_tool_result_renders_its_error_marker_in_every_template(template: str) -> None:
    tokenizer = load_tokenizer()
    source = (
        tokenizer.chat_template if template == "builtin" else (TEMPLATES / template).read_text()
    )
    body = three_reads(
        result("t_calc", "ok"),
        result("t_missing", "File does not exist.", is_error=True),
        result("t_util", "ok"),
    )
    messages = anthropic.translate_request(body).messages
    text = render(source, messages, **tokenizer.special_tokens_map)
    assert TOOL_ERROR_MARKER + "File does not exist." in text
    assert text.count(TOOL_ERROR_MARKER) == 1


# --- server tools -----------------------------------------------------------------------------


def test_server_tools_are_withheld_and_named() -> None:
    body = {
        "model": "m",
        "max_tokens": 16,
        "tools": [
            READ,
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
            {"type": "code_execution_20250522", "name": "code_execution"},
        ],
        "messages": [{"role": "user", "content": "hi"}],
    }
    conversation = anthropic.translate_request(body)
    assert [t["function"]["name"] for t in conversation.tools or ()] == ["Read"]
    assert conversation.withheld_tools == ["web_search_20250305", "code_execution_20250522"]
    openai_body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "custom", "custom": {"name": "grammar"}}],
    }
    assert openai.translate_request(openai_body).withheld_tools == ["custom"]
    assert openai.translate_request(openai_body).tools == []


def test_server_tool_history_and_tool_search_blocks_render_as_text() -> None:
    search = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": [
            {
                "type": "web_search_result",
                "url": "https://example.com/w",
                "title": "Weather",
                "encrypted_content": "OPAQUE",
                "page_age": "1 day",
            }
        ],
    }
    body = {
        "model": "m",
        "max_tokens": 16,
        "tools": [READ],
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Searching."},
                    {
                        "type": "server_tool_use",
                        "id": "srvtoolu_1",
                        "name": "web_search",
                        "input": {"query": "weather"},
                    },
                    search,
                    {"type": "text", "text": "Sunny."},
                    tool_use("t1", "notes.md"),
                ],
            },
            {
                "role": "user",
                "content": [
                    result(
                        "t1",
                        [
                            {"type": "tool_reference", "tool_name": "Grep"},
                            {
                                "type": "search_result",
                                "source": "notes.md",
                                "title": "Notes",
                                "content": [{"type": "text", "text": "sunny all week"}],
                            },
                        ],
                    )
                ],
            },
        ],
    }
    messages = anthropic.translate_request(body).messages
    assert messages[1]["content"] == (
        'Searching.\n\n[web_search call: {"query": "weather"}]\n\n'
        "[web_search_tool_result]\nhttps://example.com/w\nWeather\n\nSunny."
    )
    assert messages[1]["tool_calls"][0]["function"]["name"] == "Read"
    assert messages[2]["content"] == (
        "[tool reference: Grep]\n[search_result]\nnotes.md\nNotes\nsunny all week"
    )


# --- tool_choice ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("choice", "mode", "forced"),
    [
        (None, ToolChoice.AUTO, None),
        ({"type": "auto"}, ToolChoice.AUTO, None),
        ({"type": "none"}, ToolChoice.NONE, None),
        ({"type": "any"}, ToolChoice.REQUIRED, None),
        ({"type": "tool", "name": "Bash"}, ToolChoice.REQUIRED, "Bash"),
    ],
)
def test_anthropic_tool_choice(choice: Any, mode: ToolChoice, forced: str | None) -> None:
    body: dict[str, Any] = {
        "model": "m",
        "max_tokens": 8,
        "tools": [READ, BASH],
        "messages": [{"role": "user", "content": "x"}],
    }
    if choice is not None:
        body["tool_choice"] = choice
    conversation = anthropic.translate_request(body)
    assert (conversation.tool_choice, conversation.forced_tool) == (mode, forced)


@pytest.mark.parametrize(
    ("choice", "mode", "forced"),
    [
        ("auto", ToolChoice.AUTO, None),
        ("none", ToolChoice.NONE, None),
        ("required", ToolChoice.REQUIRED, None),
        ({"type": "function", "function": {"name": "Read"}}, ToolChoice.REQUIRED, "Read"),
    ],
)
def test_openai_tool_choice(choice: Any, mode: ToolChoice, forced: str | None) -> None:
    tool = {"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}}
    body = {
        "model": "m",
        "tools": [tool],
        "tool_choice": choice,
        "messages": [{"role": "user", "content": "x"}],
    }
    conversation = openai.translate_request(body)
    assert (conversation.tool_choice, conversation.forced_tool) == (mode, forced)


@pytest.mark.parametrize(
    ("tools", "choice", "match"),
    [
        ([READ], {"type": "tool", "name": "Write"}, "not a declared tool"),
        (
            [{"type": "web_search_20250305", "name": "web_search"}],
            {"type": "tool", "name": "web_search"},
            "offers no tools",
        ),
        ([READ, {"type": "web_search_20250305"}], {"type": "tool", "name": "x"}, "not a declared"),
        ([], {"type": "any"}, "offers no tools"),
        ([READ], {"type": "sometimes"}, "tool_choice must be"),
        ([READ], {"type": "tool"}, "needs a name"),
    ],
)
def test_a_tool_choice_that_cannot_be_honoured_is_refused(
    tools: list, choice: Any, match: str
) -> None:
    body = {
        "model": "m",
        "max_tokens": 8,
        "tools": tools,
        "tool_choice": choice,
        "messages": [{"role": "user", "content": "x"}],
    }
    with pytest.raises(RequestError, match=match):
        anthropic.translate_request(body)


# --- media and empty content ------------------------------------------------------------------


def test_media_become_placeholders_and_are_counted() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    document = {"type": "document", "source": {"type": "text", "data": "x"}}
    body = {
        "model": "m",
        "max_tokens": 8,
        "tools": [READ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"}, image, image]},
            {"role": "assistant", "content": [tool_use("t1", "a.pdf")]},
            {"role": "user", "content": [result("t1", [document])]},
        ],
    }
    # Translation marks images; for a family without a vision encoder they become `[image]`.
    conversation = resolve_images(anthropic.translate_request(body), None)
    assert conversation.dropped_media == {"image": 2, "document": 1}
    assert conversation.messages[0]["content"] == "look\n[image]\n[image]"
    url = {"type": "image_url", "image_url": {"url": "data:,"}}
    oa = openai.translate_request(
        {"model": "m", "messages": [{"role": "user", "content": [url, {"type": "file"}]}]}
    )
    assert oa.dropped_media == {"image": 1, "document": 1}


@pytest.mark.parametrize("content", ["", []])
def test_an_empty_anthropic_user_message_is_refused(content: Any) -> None:
    # As the Messages API refuses it: it would render a turn with nothing said.
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
    with pytest.raises(RequestError, match=r"messages\[0\].content must not be empty"):
        anthropic.translate_request(body)
