"""Model output parses into assistant messages without ever raising, and `format_output` writes
the exact text templates/qwen3.jinja renders for an assistant turn."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from support import fixtures
from tokentrail.text.chat_template import render
from tokentrail.text.parsing import OutputFormatError, ParsedOutput, format_output, parse_output
from tokentrail.text.tokenizer import _builtin_chat_template

QWEN3_TEMPLATE = _builtin_chat_template("qwen3")


def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(content: str, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


# --- Hermes / Qwen3 -----------------------------------------------------------------------------


def test_plain_text() -> None:
    assert parse_output("Just words.") == ParsedOutput(assistant("Just words."))
    assert parse_output("") == ParsedOutput(assistant(""))


def test_reasoning_content_and_calls() -> None:
    text = (
        "<think>\nNeed the weather.\n</think>\n\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    assert parse_output(text) == ParsedOutput(
        assistant(
            "Checking.",
            reasoning_content="Need the weather.",
            tool_calls=[call("get_weather", {"city": "Zürich"}), call("get_time", {})],
        )
    )


def test_whitespace_around_the_json_is_allowed() -> None:
    text = '<tool_call>  {"name":"f","arguments":{"a":1}}\t\n</tool_call>\n'
    assert parse_output(text) == ParsedOutput(assistant("", tool_calls=[call("f", {"a": 1})]))


def test_missing_arguments_mean_none() -> None:
    parsed = parse_output('<tool_call>\n{"name": "list_files"}\n</tool_call>')
    assert parsed.message["tool_calls"] == [call("list_files", {})]


def test_think_opened_by_the_prompt() -> None:
    # Templates that end the prompt with "<think>\n" leave only the closing tag to the model.
    parsed = parse_output("Reasoning here.\n</think>\n\nAnswer.")
    assert parsed == ParsedOutput(assistant("Answer.", reasoning_content="Reasoning here."))


def test_empty_think_block() -> None:
    parsed = parse_output("<think>\n\n</think>\n\nHi")
    assert parsed == ParsedOutput(assistant("Hi", reasoning_content=""))


def test_parsers_can_be_switched_off() -> None:
    text = '<think>\nr\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    assert parse_output(text, tool_parser=None, reasoning_parser=None) == ParsedOutput(
        assistant(text)
    )
    only_reasoning = parse_output(text, tool_parser=None)
    assert only_reasoning.message == assistant(text.split("\n\n", 1)[1], reasoning_content="r")
    only_tools = parse_output(text, reasoning_parser=None)
    assert only_tools.message["content"] == "<think>\nr\n</think>\n"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('Sure. <tool_call>\n{"name": "f", "arguments": {}}', "unclosed <tool_call>"),
        ('<tool_call>\n{"name": "f", "arguments": {}\n</tool_call>', "not valid JSON"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "no name"),
        ('<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>', "no name"),
        ('<tool_call>\n{"name": "f", "arguments": "{}"}\n</tool_call>', "not a JSON object"),
        ('<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>', "not a JSON object"),
        ('<tool_call>\n["f", {}]\n</tool_call>', "not a JSON object"),
        ('<tool_call>\n{"name": "f", "arguments": {"x": NaN}}\n</tool_call>', "NaN"),
        (
            '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\nDone!',
            "text after a tool call",
        ),
        (
            '<tool_call>\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
            "not valid JSON",
        ),
        ('<tool_call>\n{"name": "f", "arguments": {}} x\n</tool_call>', "unexpected text"),
        ("<think>\nI was cut off", "unclosed <think>"),
    ],
)
def test_ill_formed_output_is_returned_as_text(text: str, reason: str) -> None:
    parsed = parse_output(text)
    assert parsed.ill_formed
    assert reason in (parsed.reason or "")
    assert parsed.message == assistant(text)


def test_markup_inside_arguments_is_data() -> None:
    # An agent editing a tool-call parser writes tool-call markup into its arguments.
    source = 'if "</tool_call>" in text:\n    start = text.find("<tool_call>")\n'
    message = assistant("", tool_calls=[call("Write", {"content": source, "path": "p.py"})])
    assert parse_output(format_output(message)) == ParsedOutput(message)
    coder = format_output(message, "qwen3_coder")
    assert parse_output(coder, tool_parser="qwen3_coder") == ParsedOutput(message)


def test_unknown_parser_names_raise() -> None:
    with pytest.raises(OutputFormatError):
        parse_output("x", tool_parser="mistral")
    with pytest.raises(OutputFormatError):
        parse_output("x", reasoning_parser="deepseek")
    with pytest.raises(OutputFormatError):
        format_output(assistant("x"), tool_format="xml")


def test_format_hermes_matches_the_template_text() -> None:
    message = assistant(
        "Let me look.",
        reasoning_content="Check first.",
        tool_calls=[call("Read", {"file_path": "/repo/calc.py", "limit": 5}), call("Ls", {})],
    )
    assert format_output(message) == (
        "<think>\nCheck first.\n</think>\n\nLet me look.\n"
        '<tool_call>\n{"name": "Read", "arguments": {"file_path": "/repo/calc.py", "limit": 5}}'
        "\n</tool_call>\n"
        '<tool_call>\n{"name": "Ls", "arguments": {}}\n</tool_call>'
    )


def test_format_accepts_openai_string_arguments_and_null_content() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
        ],
    }
    assert (
        format_output(message) == '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    )
    assert format_output(message, "qwen3_coder") == (
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"
    )


# --- Qwen3-Coder XML ----------------------------------------------------------------------------

CODER_CALL = (
    "<tool_call>\n<function=Edit>\n"
    "<parameter=file_path>\n/repo/calc.py\n</parameter>\n"
    "<parameter=old_string>\n    return a+b   \n\n</parameter>\n"
    "<parameter=replace_all>\nfalse\n</parameter>\n"
    "<parameter=count>\n3\n</parameter>\n"
    '<parameter=opts>\n{"a": [1, null]}\n</parameter>\n'
    "</function>\n</tool_call>"
)


def test_qwen3_coder_call() -> None:
    parsed = parse_output("I will edit.\n\n" + CODER_CALL, tool_parser="qwen3_coder")
    arguments = {
        "file_path": "/repo/calc.py",
        "old_string": "    return a+b   \n",  # exactly one newline stripped at each end
        "replace_all": False,
        "count": 3,
        "opts": {"a": [1, None]},
    }
    assert parsed == ParsedOutput(assistant("I will edit.", tool_calls=[call("Edit", arguments)]))
    assert format_output(parsed.message, "qwen3_coder") == "I will edit.\n\n" + CODER_CALL


def test_qwen3_coder_values_follow_the_schema() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string"},
                        "flag": {"type": "boolean"},
                        "n": {"anyOf": [{"type": "number"}, {"type": "null"}]},
                    },
                },
            },
        }
    ]
    text = (
        "<tool_call>\n<function=f>\n<parameter=text>\n123\n</parameter>\n"
        "<parameter=flag>\nTrue\n</parameter>\n<parameter=n>\n7\n</parameter>\n"
        "<parameter=other>\n[1]\n</parameter>\n</function>\n</tool_call>"
    )
    arguments = parse_output(text, "qwen3_coder", tools=tools).message["tool_calls"][0]["function"][
        "arguments"
    ]
    assert arguments == {"text": "123", "flag": True, "n": 7, "other": [1]}
    no_schema = parse_output(text, "qwen3_coder").message["tool_calls"][0]["function"]["arguments"]
    assert no_schema == {"text": 123, "flag": "True", "n": 7, "other": [1]}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("<function=f>\n<parameter=a>\n1\n</parameter>\n", "missing </function>"),
        ("<function=f>\n<parameter=a>\n1\n</function>", "unclosed <parameter=a>"),
        ("<function=>\n</function>", "no name"),
        ("<function=f>\nhello\n</function>", "unexpected text"),
        (
            "<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>",
            "twice",
        ),
        ('{"name": "f", "arguments": {}}', "<function=NAME>"),
    ],
)
def test_ill_formed_qwen3_coder_calls(body: str, reason: str) -> None:
    text = f"<tool_call>\n{body}\n</tool_call>"
    parsed = parse_output(text, tool_parser="qwen3_coder")
    assert parsed.ill_formed and reason in (parsed.reason or "")
    assert parsed.message == assistant(text)


# --- round trips --------------------------------------------------------------------------------

MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>")
# Markup words are likely in the drawn text, so the parser's tag scanning is exercised.
words = st.sampled_from(
    [*MARKUP, "<function=f>", "</function>", "<parameter=", "\n", " ", "{", '"']
)
any_text = st.lists(st.text(max_size=8) | words, max_size=6).map("".join)
# Message content and reasoning cannot hold the markup that delimits them.
text = any_text.filter(lambda s: not any(m in s for m in MARKUP))
# Neither can a Qwen3-Coder parameter value hold the tag that closes it.
coder_text = any_text.filter(lambda s: "</parameter>" not in s)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,20}", fullmatch=True)


def json_values(strings: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers(-(10**12), 10**12) | strings
    scalars |= st.floats(allow_nan=False, allow_infinity=False)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strings, inner, max_size=3),
        max_leaves=8,
    )


def _not_json_non_string(s: str) -> bool:
    try:
        return isinstance(json.loads(s), str)
    except ValueError:
        return True


@st.composite
def messages(draw: st.DrawFn, coder: bool = False) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": draw(text)}
    if draw(st.booleans()):
        message["reasoning_content"] = draw(text)
    # Without a schema, a Qwen3-Coder string that reads as JSON (say "12") comes back as JSON.
    if coder:
        values = json_values(coder_text).filter(
            lambda v: not isinstance(v, str) or _not_json_non_string(v)
        )
        arguments = st.dictionaries(names, values, max_size=4)
    else:
        arguments = st.dictionaries(any_text, json_values(any_text), max_size=4)
    calls = draw(st.lists(st.builds(call, names, arguments), max_size=3))
    if calls:
        message["tool_calls"] = calls
    return message


@given(
    any_text,
    st.sampled_from(["hermes", "qwen3_coder", None]),
    st.sampled_from(["qwen3", None]),
)
def test_parse_never_raises(output: str, tool_parser: str | None, reasoning: str | None) -> None:
    parsed = parse_output(output, tool_parser=tool_parser, reasoning_parser=reasoning)
    assert parsed.message["role"] == "assistant"
    if parsed.ill_formed:
        assert parsed.reason and parsed.message == assistant(output)


@given(messages())
def test_hermes_round_trip(message: dict[str, Any]) -> None:
    assert parse_output(format_output(message)) == ParsedOutput(message)


@given(messages(coder=True))
def test_qwen3_coder_round_trip(message: dict[str, Any]) -> None:
    parsed = parse_output(format_output(message, "qwen3_coder"), tool_parser="qwen3_coder")
    assert parsed == ParsedOutput(message)


@given(st.lists(st.sampled_from(["user", "tool", "system"]), min_size=1, max_size=4), messages())
def test_format_output_splices_into_the_rendered_prompt(
    roles: list[str], message: dict[str, Any]
) -> None:
    # What the engine sampled after the generation prompt, plus the stop token's text, is exactly
    # what the template renders when that message joins the history.
    history = [{"role": r, "content": f"{r} says hi"} for r in roles]
    prompt = render(QWEN3_TEMPLATE, history, add_generation_prompt=True)
    full = render(QWEN3_TEMPLATE, [*history, message], add_generation_prompt=False)
    assert full == prompt + format_output(message) + "<|im_end|>\n"


def test_claude_code_calls_round_trip() -> None:
    request = fixtures.load(fixtures.CLAUDE_CODE)["exchanges"][-1]["request"]
    tools = [{"name": t["name"], "parameters": t["input_schema"]} for t in request["tools"]]
    uses = [
        b
        for m in request["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    assert uses
    for use in uses:
        message = assistant("", tool_calls=[call(use["name"], use["input"])])
        assert parse_output(format_output(message)) == ParsedOutput(message)
        coder_text = format_output(message, "qwen3_coder")
        assert parse_output(coder_text, "qwen3_coder", tools=tools) == ParsedOutput(message)
