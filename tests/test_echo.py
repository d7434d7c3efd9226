"""Tests for echo recognition: a harness's re-rendering of a generated message is recognized.

Uses the real Claude Code 2.1.197 traffic in `tests/fixtures`, hand-made schemas for the
default rules, and hypothesis for the view's algebra (fill-in and whitespace invariance).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support import fixtures
from tokentrail.errors import MessageError
from tokentrail.trajectory.echo import (
    ToolDefaults,
    echo_difference,
    echo_normalize,
    echo_view,
    is_echo,
)

# --- helpers -------------------------------------------------------------------------------


def load_fixture() -> dict[str, Any]:
    return fixtures.load(fixtures.CLAUDE_CODE)


def openai_tools(anthropic_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic tools (`input_schema`) to the OpenAI style tokentrail uses internally."""
    return [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t["input_schema"],
            },
        }
        for t in anthropic_tools
    ]


def as_message(content: list[dict[str, Any]] | str) -> dict[str, Any]:
    """An Anthropic assistant turn in the chat-template format: text joined, tool_use as calls."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(b["text"] for b in content if b["type"] == "text"),
    }
    calls = [
        {"type": "function", "function": {"name": b["name"], "arguments": b["input"]}}
        for b in content
        if b["type"] == "tool_use"
    ]
    if calls:
        message["tool_calls"] = calls
    return message


def tool(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": "",
            "parameters": {"type": "object", "properties": properties},
        },
    }


def call(name: str, arguments: Any, content: str = "") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


@pytest.fixture(scope="module")
def fixture() -> dict[str, Any]:
    return load_fixture()


@pytest.fixture(scope="module")
def cc_tools(fixture: dict[str, Any]) -> list[dict[str, Any]]:
    return openai_tools(fixture["exchanges"][0]["request"]["tools"])


# --- the Claude Code re-renderings ---------------------------------------------------------


def test_edit_echo_fills_replace_all_and_strips_new_string(cc_tools: list[dict[str, Any]]) -> None:
    generated = call(
        "Edit",
        {
            "file_path": "/repo/calc.py",
            "old_string": "    return a+b   \n",
            "new_string": "    # sum   \n    return a + b\n",
        },
    )
    echoed = call(
        "Edit",
        {
            "replace_all": False,
            "file_path": "/repo/calc.py",
            "old_string": "    return a+b   \n",
            "new_string": "    # sum\n    return a + b\n",
        },
    )
    assert generated != echoed
    assert is_echo(generated, echoed, cc_tools)
    assert echo_difference(generated, echoed, cc_tools) is None


def test_edit_with_replace_all_true_is_not_an_echo_of_one_without(
    cc_tools: list[dict[str, Any]],
) -> None:
    args = {"file_path": "/f.py", "old_string": "a", "new_string": "b"}
    assert not is_echo(call("Edit", args), call("Edit", {**args, "replace_all": True}), cc_tools)


def test_write_echo_right_strips_every_line(cc_tools: list[dict[str, Any]]) -> None:
    generated = call(
        "Write",
        {"file_path": "/repo/util.py", "content": "def mul(a, b):   \n    return a * b  \n\t\n"},
    )
    echoed = call(
        "Write", {"file_path": "/repo/util.py", "content": "def mul(a, b):\n    return a * b\n\n"}
    )
    assert generated != echoed
    assert is_echo(generated, echoed, cc_tools)


def test_line_structure_is_kept() -> None:
    a = {"role": "assistant", "content": "x  \n\t\ny"}
    assert is_echo(a, {"role": "assistant", "content": "x\n\ny"}, None)
    assert not is_echo(a, {"role": "assistant", "content": "x\ny"}, None)
    assert not is_echo(a, {"role": "assistant", "content": "xy"}, None)
    # Argument strings keep it at their ends too: only the message's own text is stripped there.
    write = call("Write", {"content": "x  \n\t\n"})
    assert is_echo(write, call("Write", {"content": "x\n\n"}), None)
    assert not is_echo(write, call("Write", {"content": "x\n"}), None)
    assert not is_echo(write, call("Write", {"content": "x"}), None)


def test_carriage_returns_count_as_trailing_whitespace() -> None:
    crlf = {"role": "assistant", "content": "one \r\ntwo\r\n"}
    assert is_echo(crlf, {"role": "assistant", "content": "one\ntwo\n"}, None)
    # A CR in the middle of a line is content, not trailing whitespace.
    assert not is_echo(
        {"role": "assistant", "content": "a\rb"}, {"role": "assistant", "content": "ab"}, None
    )


# --- defaults of every JSON type -----------------------------------------------------------


def test_true_default() -> None:
    tools = [tool("T", {"x": {"type": "string"}, "flag": {"type": "boolean", "default": True}})]
    bare = call("T", {"x": "1"})
    assert is_echo(bare, call("T", {"x": "1", "flag": True}), tools)
    assert not is_echo(bare, call("T", {"x": "1", "flag": False}), tools)
    assert not is_echo(bare, call("T", {"x": "1", "flag": 1}), tools)


def test_false_default() -> None:
    tools = [tool("T", {"x": {"type": "string"}, "flag": {"type": "boolean", "default": False}})]
    bare = call("T", {"x": "1"})
    assert is_echo(bare, call("T", {"x": "1", "flag": False}), tools)
    assert not is_echo(bare, call("T", {"x": "1", "flag": True}), tools)


def test_false_default_does_not_match_zero() -> None:
    tools = [tool("T", {"n": {"default": False}})]
    assert not is_echo(call("T", {}), call("T", {"n": 0}), tools)
    assert not is_echo(call("T", {"n": False}), call("T", {"n": 0}), tools)
    assert not is_echo(call("T", {}), call("T", {"n": 0.0}), tools)


def test_numeric_default_one_does_not_match_true() -> None:
    tools = [tool("T", {"n": {"type": "integer", "default": 1}})]
    assert is_echo(call("T", {}), call("T", {"n": 1}), tools)
    assert not is_echo(call("T", {}), call("T", {"n": True}), tools)
    assert not is_echo(call("T", {"n": 1}), call("T", {"n": True}), tools)


def test_bool_and_number_differ_even_without_a_schema() -> None:
    assert not is_echo(call("T", {"n": True}), call("T", {"n": 1}), None)
    assert not is_echo(call("T", {"n": [False]}), call("T", {"n": [0]}), None)
    assert not is_echo(call("T", {"n": None}), call("T", {"n": False}), None)


def test_one_and_one_point_zero_are_the_same_json_number() -> None:
    # JavaScript harnesses re-serialize 1.0 as 1.
    tools = [tool("T", {"timeout": {"type": "number", "default": 30000}})]
    assert is_echo(call("T", {"timeout": 2.0}), call("T", {"timeout": 2}), None)
    assert is_echo(call("T", {}), call("T", {"timeout": 30000.0}), tools)
    assert not is_echo(call("T", {"timeout": 2.5}), call("T", {"timeout": 2}), None)


@pytest.mark.parametrize(
    ("default", "same", "different"),
    [
        pytest.param(30000, [30000, 30000.0], [30001, "30000", True, None], id="number"),
        pytest.param("auto", ["auto", "auto  "], ["Auto", " auto", "", None], id="string"),
        pytest.param(
            ["a", "b"], [["a", "b"], ["a ", "b"]], [["b", "a"], ["a"], [], "a"], id="list"
        ),
        pytest.param({"k": 1}, [{"k": 1}, {"k": 1.0}], [{"k": 2}, {}, {"k": True}], id="object"),
        pytest.param(None, [None], [False, 0, "", "null"], id="null"),
    ],
)
def test_defaults_of_each_json_type(default: Any, same: list[Any], different: list[Any]) -> None:
    tools = [tool("T", {"x": {"type": "string"}, "opt": {"default": default}})]
    bare = call("T", {"x": "v"})
    for value in same:
        assert is_echo(bare, call("T", {"x": "v", "opt": value}), tools), value
    for value in different:
        assert not is_echo(bare, call("T", {"x": "v", "opt": value}), tools), value


def test_default_filled_on_the_generated_side_too() -> None:
    tools = [tool("T", {"flag": {"type": "boolean", "default": False}})]
    assert is_echo(call("T", {"flag": False}), call("T", {}), tools)


# --- nested schemas ------------------------------------------------------------------------

NESTED = [
    tool(
        "Query",
        {
            "q": {"type": "string"},
            "options": {
                "type": "object",
                "properties": {
                    "limit": {"type": "integer", "default": 10},
                    "sort": {
                        "type": "object",
                        "properties": {"desc": {"type": "boolean", "default": False}},
                    },
                },
            },
            "filters": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "field": {"type": "string"},
                        "negate": {"type": "boolean", "default": False},
                    },
                },
            },
        },
    )
]


def test_defaults_inside_nested_objects_are_honoured() -> None:
    generated = call("Query", {"q": "x", "options": {"sort": {}}})
    echoed = call("Query", {"q": "x", "options": {"limit": 10, "sort": {"desc": False}}})
    assert is_echo(generated, echoed, NESTED)


def test_defaults_inside_array_items_are_honoured() -> None:
    generated = call("Query", {"q": "x", "filters": [{"field": "a"}, {"field": "b  "}]})
    echoed = call(
        "Query",
        {"q": "x", "filters": [{"field": "a", "negate": False}, {"field": "b", "negate": False}]},
    )
    assert is_echo(generated, echoed, NESTED)


@pytest.mark.parametrize(
    "echoed_arguments",
    [
        pytest.param({"q": "x", "options": {"limit": 11}}, id="nested-default-changed"),
        pytest.param({"q": "x", "options": {"sort": {"desc": True}}}, id="deeper-default-changed"),
        pytest.param({"q": "x", "filters": [{"field": "a", "negate": True}]}, id="item-changed"),
        pytest.param({"q": "x", "filters": [{"field": "a", "negate": 0}]}, id="item-bool-vs-int"),
        pytest.param({"q": "x", "options": {"limit": 10, "page": 1}}, id="nested-extra-key"),
    ],
)
def test_a_differing_nested_value_is_not_an_echo(echoed_arguments: dict[str, Any]) -> None:
    generated = call("Query", {"q": "x", "options": {}, "filters": [{"field": "a"}]})
    echoed = copy.deepcopy(echoed_arguments)
    echoed.setdefault("options", {})
    echoed.setdefault("filters", [{"field": "a"}])
    assert not is_echo(generated, call("Query", echoed), NESTED)


def test_no_defaults_are_guessed_inside_any_of() -> None:
    tools = [
        tool(
            "T",
            {
                "mode": {
                    "anyOf": [
                        {"type": "object", "properties": {"fast": {"default": True}}},
                        {"type": "string"},
                    ],
                    "default": "auto",
                }
            },
        )
    ]
    # The property's own default applies; defaults inside the branches do not.
    assert is_echo(call("T", {}), call("T", {"mode": "auto"}), tools)
    assert not is_echo(call("T", {"mode": {}}), call("T", {"mode": {"fast": True}}), tools)


# --- without a schema ----------------------------------------------------------------------


def test_without_a_schema_only_whitespace_is_forgiven(cc_tools: list[dict[str, Any]]) -> None:
    generated = call("Edit", {"file_path": "/f", "old_string": "a", "new_string": "b  \n"})
    filled = call(
        "Edit", {"file_path": "/f", "old_string": "a", "new_string": "b  \n", "replace_all": False}
    )
    stripped = call("Edit", {"file_path": "/f", "old_string": "a", "new_string": "b\n"})
    assert is_echo(generated, filled, cc_tools)
    for tools in (None, [], [tool("Other", {"replace_all": {"default": False}})]):
        assert not is_echo(generated, filled, tools)
        assert is_echo(generated, stripped, tools)


def test_a_tool_declared_twice_gets_no_defaults() -> None:
    tools = [tool("T", {"n": {"default": 1}}), tool("T", {"n": {"default": 2}})]
    assert not is_echo(call("T", {}), call("T", {"n": 1}), tools)
    assert not is_echo(call("T", {}), call("T", {"n": 2}), tools)


def test_anthropic_style_tools_are_accepted(fixture: dict[str, Any]) -> None:
    anthropic = fixture["exchanges"][0]["request"]["tools"]
    generated = call("Edit", {"file_path": "/f", "old_string": "a", "new_string": "b"})
    echoed = call(
        "Edit", {"file_path": "/f", "old_string": "a", "new_string": "b", "replace_all": False}
    )
    assert is_echo(generated, echoed, anthropic)
    assert is_echo(generated, echoed, ToolDefaults(anthropic))


# --- rejections ----------------------------------------------------------------------------

EDIT = {"file_path": "/repo/calc.py", "old_string": "  x = 1\n", "new_string": "  x = 2   \n"}


def edit(**changes: Any) -> dict[str, Any]:
    return call("Edit", {**EDIT, **changes})


def with_key(message: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    return {**message, key: value}


@pytest.mark.parametrize(
    "incoming",
    [
        pytest.param(edit(old_string="  x = 3\n"), id="old_string"),
        pytest.param(edit(file_path="/repo/other.py"), id="file"),
        pytest.param(call("Write", {"file_path": EDIT["file_path"], "content": "x"}), id="tool"),
        pytest.param({"role": "assistant", "content": json.dumps(EDIT)}, id="text-not-call"),
        pytest.param(edit(new_string="x = 2\n"), id="leading-whitespace"),
        pytest.param(edit(old_string="x = 1\n"), id="leading-whitespace-old"),
        pytest.param(edit(new_string="  x = 2"), id="newline-dropped"),
        pytest.param(edit(replace_all=True), id="non-default-value"),
        pytest.param(edit(replace_all=0), id="bool-vs-int"),
        pytest.param(edit(extra="1"), id="undeclared-argument"),
        pytest.param(with_key(edit(), "role", "user"), id="role"),
        pytest.param(with_key(edit(), "content", "ok"), id="content"),
        pytest.param(with_key(edit(), "reasoning_content", "think"), id="reasoning-one-side"),
        pytest.param(with_key(edit(), "name", "bot"), id="key-one-side"),
        pytest.param(
            {**edit(), "tool_calls": edit()["tool_calls"] * 2},
            id="extra-call",
        ),
        pytest.param({**edit(), "tool_calls": []}, id="missing-call"),
        pytest.param(
            {**edit(), "tool_calls": [{**edit()["tool_calls"][0], "id": "toolu_1"}]},
            id="call-id-one-side",
        ),
    ],
)
def test_not_an_echo(incoming: dict[str, Any], cc_tools: list[dict[str, Any]]) -> None:
    assert not is_echo(edit(), incoming, cc_tools)
    assert echo_difference(edit(), incoming, cc_tools) is not None


def test_reasoning_must_match_up_to_trailing_whitespace() -> None:
    generated = {"role": "assistant", "content": "", "reasoning_content": "think  \nmore"}
    same = {"role": "assistant", "content": "", "reasoning_content": "think\nmore"}
    other = {"role": "assistant", "content": "", "reasoning_content": "think\nless"}
    assert is_echo(generated, same, None)
    assert not is_echo(generated, other, None)


def test_call_order_matters(cc_tools: list[dict[str, Any]]) -> None:
    read = call("Read", {"file_path": "/a"})["tool_calls"][0]
    bash = call("Bash", {"command": "ls"})["tool_calls"][0]
    a = {"role": "assistant", "content": "", "tool_calls": [read, bash]}
    b = {"role": "assistant", "content": "", "tool_calls": [bash, read]}
    assert not is_echo(a, b, cc_tools)


def test_identifiers_are_not_stripped() -> None:
    assert not is_echo(call("Edit", {}), call("Edit ", {}), None)
    assert not is_echo(
        {"role": "assistant", "content": ""}, {"role": "assistant ", "content": ""}, None
    )


def test_arguments_as_a_json_string_are_the_object_they_encode(
    cc_tools: list[dict[str, Any]],
) -> None:
    text = json.dumps({"file_path": "/f", "old_string": "a", "new_string": "b"})
    filled = json.dumps({"file_path": "/f", "old_string": "a", "new_string": "b", "replace_all": 0})
    defaulted = json.dumps({"replace_all": False, "new_string": "b", "old_string": "a",
                            "file_path": "/f"}, separators=(",", ":"))  # fmt: skip
    assert is_echo(call("Edit", text + "  "), call("Edit", text), cc_tools)
    assert is_echo(call("Edit", text), call("Edit", defaulted), cc_tools)
    assert not is_echo(call("Edit", text), call("Edit", filled), cc_tools)


# --- API details ---------------------------------------------------------------------------


def test_echo_difference_names_the_path(cc_tools: list[dict[str, Any]]) -> None:
    assert echo_difference(edit(), edit(old_string="y\n"), cc_tools) == (
        "tool_calls[0].function.arguments.old_string: '  x = 1\\n' vs 'y\\n'"
    )
    assert echo_difference(edit(), edit(replace_all=0), cc_tools) == (
        "tool_calls[0].function.arguments.replace_all: only in incoming (0)"
    )
    assert echo_difference(edit(), edit(replace_all=True), None) == (
        "tool_calls[0].function.arguments.replace_all: only in incoming (True)"
    )
    assert echo_difference(call("T", {"n": False}), call("T", {"n": 0}), None) == (
        "tool_calls[0].function.arguments.n: boolean False vs number 0"
    )


def test_views_are_hashable_and_key_order_free(cc_tools: list[dict[str, Any]]) -> None:
    generated = edit()
    index = {echo_view(generated, cc_tools): generated}
    reordered = call("Edit", dict(reversed(list({**EDIT, "replace_all": False}.items()))))
    assert index[echo_view(reordered, cc_tools)] is generated


def test_normalize_gives_the_canonical_message(cc_tools: list[dict[str, Any]]) -> None:
    assert echo_normalize(edit(replace_all=False), cc_tools) == {
        "content": "",
        "role": "assistant",
        "tool_calls": [
            {
                "function": {
                    "arguments": {
                        "file_path": "/repo/calc.py",
                        "new_string": "  x = 2\n",
                        "old_string": "  x = 1\n",
                    },
                    "name": "Edit",
                },
                "type": "function",
            }
        ],
    }


def test_non_json_values_are_rejected() -> None:
    with pytest.raises(MessageError):
        echo_view({"role": "assistant", "content": object()}, None)
    with pytest.raises(MessageError):
        echo_view(["not", "a", "message"], None)  # type: ignore[arg-type]
    with pytest.raises(MessageError):
        echo_view(call("T", {1: "int key"}), None)


# --- the real Claude Code traffic ----------------------------------------------------------


def assistant_turns(exchange: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in exchange["request"]["messages"] if m["role"] == "assistant"]


def fixture_echoes(
    fixture: dict[str, Any],
) -> list[tuple[int, int, dict[str, Any], dict[str, Any]]]:
    """(request i, reply j, reply j as generated, its echo in request i) for every echo."""
    exchanges = fixture["exchanges"]
    out = []
    for i in range(1, len(exchanges)):
        echoed = assistant_turns(exchanges[i])
        # The session is linear: request i replays replies 0..i-1, in order.
        assert len(echoed) == i
        for j, message in enumerate(echoed):
            generated = as_message(exchanges[j]["reply_content"])
            out.append((i, j, generated, as_message(message["content"])))
    return out


def test_every_replayed_reply_in_the_fixture_is_an_echo(
    fixture: dict[str, Any], cc_tools: list[dict[str, Any]]
) -> None:
    echoes = fixture_echoes(fixture)
    assert len(echoes) == 15
    for i, j, generated, echoed in echoes:
        assert is_echo(generated, echoed, cc_tools), (i, j, echo_difference(generated, echoed, []))


def test_fixture_echoes_that_are_not_byte_identical(
    fixture: dict[str, Any], cc_tools: list[dict[str, Any]]
) -> None:
    # Replies 1 (Edit) and 2 (Write to util.py) come back re-rendered in every later request;
    # the text reply, the Write to notes.md and the Bash call come back verbatim, trailing
    # spaces included.
    differing = {j for _, j, generated, echoed in fixture_echoes(fixture) if generated != echoed}
    assert differing == {1, 2}

    exchanges = fixture["exchanges"]
    edit_generated = exchanges[1]["reply_content"][0]["input"]
    edit_echoed = assistant_turns(exchanges[2])[1]["content"][0]["input"]
    assert "replace_all" not in edit_generated
    assert edit_echoed["replace_all"] is False
    assert edit_generated["new_string"] == "    # sum   \n    return a + b\n"
    assert edit_echoed["new_string"] == "    # sum\n    return a + b\n"
    assert edit_echoed["old_string"] == edit_generated["old_string"] == "    return a+b   \n"

    write_generated = exchanges[2]["reply_content"][0]["input"]
    write_echoed = assistant_turns(exchanges[3])[2]["content"][0]["input"]
    assert write_generated["content"] == "def mul(a, b):   \n    return a * b  \n\t\n"
    assert write_echoed["content"] == "def mul(a, b):\n    return a * b\n\n"

    # The Edit echo needs the schema; the Write echo needs only the whitespace view.
    edit_pair = (call("Edit", edit_generated), call("Edit", edit_echoed))
    write_pair = (call("Write", write_generated), call("Write", write_echoed))
    assert is_echo(*edit_pair, cc_tools)
    assert not is_echo(*edit_pair, None)
    assert is_echo(*write_pair, None)


# --- properties ----------------------------------------------------------------------------

TRAILING = st.text(alphabet=" \t\r", max_size=3)
TEXT = st.text(alphabet="ab \t\n\r", max_size=12)
KEYS = st.sampled_from(["a", "b", "c", "d", "e"])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False, width=16)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)


def object_schemas(depth: int) -> st.SearchStrategy[dict[str, Any]]:
    leaf = st.builds(lambda d: {"default": d}, json_values) | st.just({"type": "string"})
    if depth == 0:
        prop = leaf
    else:
        nested = object_schemas(depth - 1)
        prop = (
            leaf
            | nested
            | st.builds(lambda s: {"type": "array", "items": s}, nested)
            | st.builds(
                lambda s, d: {**s, "default": d},
                nested,
                st.dictionaries(KEYS, json_values, max_size=2),
            )
        )
    return st.builds(
        lambda props: {"type": "object", "properties": props},
        st.dictionaries(KEYS, prop, max_size=4),
    )


def draw_value(data: st.DataObject, schema: dict[str, Any]) -> Any:
    """A value for `schema`: objects follow their properties, leaves are often their default."""
    if "properties" in schema:
        out = {}
        for key, sub in schema["properties"].items():
            if data.draw(st.booleans()):
                out[key] = draw_value(data, sub)
        return out
    if "items" in schema:
        return [draw_value(data, schema["items"]) for _ in range(data.draw(st.integers(0, 2)))]
    if "default" in schema and data.draw(st.booleans()):
        return copy.deepcopy(schema["default"])
    return data.draw(json_values)


def rerender(data: st.DataObject, schema: dict[str, Any], value: Any) -> Any:
    """What a harness might send back: defaults filled in or dropped, lines right-padded."""
    if isinstance(value, dict) and "properties" in schema:
        out = {}
        for key, sub in schema["properties"].items():
            if key in value:
                is_default = "default" in sub and _same_json(value[key], sub["default"])
                if is_default and data.draw(st.booleans()):
                    continue  # dropped: it was the default
                out[key] = rerender(data, sub, value[key])
            elif "default" in sub and data.draw(st.booleans()):
                out[key] = rerender(data, sub, copy.deepcopy(sub["default"]))
        for key in value.keys() - schema["properties"].keys():
            out[key] = pad(data, value[key])
        keys = list(out)
        order = data.draw(st.permutations(keys))
        return {k: out[k] for k in order}
    if isinstance(value, list) and "items" in schema:
        return [rerender(data, schema["items"], v) for v in value]
    return pad(data, value)


def _same_json(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def pad(data: st.DataObject, value: Any) -> Any:
    if isinstance(value, str):
        return "\n".join(line + data.draw(TRAILING) for line in value.split("\n"))
    if isinstance(value, list):
        return [pad(data, v) for v in value]
    if isinstance(value, dict):
        return {k: pad(data, v) for k, v in value.items()}
    return value


@settings(max_examples=300, deadline=None)
@given(schema=object_schemas(2), data=st.data())
def test_view_ignores_filled_defaults_and_trailing_whitespace(
    schema: dict[str, Any], data: st.DataObject
) -> None:
    tools = [{"type": "function", "function": {"name": "T", "parameters": schema}}]
    arguments = draw_value(data, schema)
    content = data.draw(TEXT)
    generated = call("T", arguments, content=content)
    echoed = call("T", rerender(data, schema, arguments), content=pad(data, content))
    assert echo_view(generated, tools) == echo_view(echoed, tools), echo_difference(
        generated, echoed, tools
    )

    # The view is a normal form: normalizing is idempotent and keeps the view.
    normal = echo_normalize(generated, tools)
    assert echo_view(normal, tools) == echo_view(generated, tools)
    assert _same_json(echo_normalize(normal, tools), normal)


@settings(max_examples=200, deadline=None)
@given(schema=object_schemas(2), data=st.data())
def test_a_changed_argument_is_never_an_echo(schema: dict[str, Any], data: st.DataObject) -> None:
    tools = [{"type": "function", "function": {"name": "T", "parameters": schema}}]
    arguments = draw_value(data, schema)
    changed = {**arguments, "marker": "x"}
    assert not is_echo(call("T", arguments), call("T", changed), tools)
    assert not is_echo(
        call("T", {**arguments, "marker": "x"}), call("T", {**arguments, "marker": "y"}), tools
    )


# --- what OpenAI-compatible harnesses drop or normalise (hermes-agent, Qwen Code) -------------


def think(content: str, reasoning: str | None, *calls: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": name, "arguments": args}}
            for name, args in calls
        ]
    return message


WRITE_ARGS = {"path": "calc.py", "content": "def mul(a, b):\n    return a * b  # café\n"}
# What hermes-agent replays: `json.dumps(json.loads(args), separators=(",", ":"),
# sort_keys=True)`, ASCII-escaped.
WRITE_HERMES = json.dumps(WRITE_ARGS, separators=(",", ":"), sort_keys=True)
WRITE_MODEL = json.dumps(WRITE_ARGS, ensure_ascii=False)

# (case, generated, incoming, is an echo). A case that is not provably the same message is not.
ECHO_CASES = [
    (
        "reasoning dropped (hermes)",
        think("Adding mul.", "  Let me write calc.py.  \n", ("write_file", WRITE_ARGS)),
        think("Adding mul.", None, ("write_file", WRITE_ARGS)),
        True,
    ),
    (
        "reasoning dropped, answer kept (hermes final answer)",
        think("Added add() to calc.py.", "Done, say so."),
        think("Added add() to calc.py.", None),
        True,
    ),
    (
        "reasoning dropped and the content differs",
        think("Adding mul.", "plan", ("write_file", WRITE_ARGS)),
        think("Adding div.", None, ("write_file", WRITE_ARGS)),
        False,
    ),
    (
        "reasoning dropped and an argument differs",
        think("", "plan", ("write_file", WRITE_ARGS)),
        think("", None, ("write_file", {**WRITE_ARGS, "path": "util.py"})),
        False,
    ),
    (
        "reasoning trimmed at both ends (Qwen Code)",
        think("", "\n  The old string was wrong; retry.  \n", ("edit", {"old_string": "a"})),
        think("", "The old string was wrong; retry.", ("edit", {"old_string": "a"})),
        True,
    ),
    ("reasoning changed", think("x", "think A"), think("x", "think B"), False),
    ("reasoning the model never wrote", think("x", None), think("x", "added"), False),
    ("an empty reasoning is none (deepseek's ' ')", think("x", None), think("x", " "), True),
    (
        "content stripped at both ends (hermes)",
        think("  I'll add add() to calc.py.\n", None),
        think("I'll add add() to calc.py.", None),
        True,
    ),
    ("content stripped to nothing", think("\n", None), think("", None), True),
    ("inner whitespace of the content changed", think("a  b", None), think("a b", None), False),
    (
        "leading whitespace of an argument (code indentation)",
        think("", None, ("write_file", {"content": "    return 1\n"})),
        think("", None, ("write_file", {"content": "return 1\n"})),
        False,
    ),
    (
        "arguments re-serialized: sorted, compact, \\u-escaped (hermes)",
        think("", None, ("write_file", WRITE_MODEL)),
        think("", None, ("write_file", WRITE_HERMES)),
        True,
    ),
    (
        "arguments as a dict, echoed as a JSON string",
        think("", None, ("write_file", WRITE_ARGS)),
        think("", None, ("write_file", WRITE_HERMES)),
        True,
    ),
    (
        "arguments re-serialized with a value changed",
        think("", None, ("write_file", WRITE_MODEL)),
        think("", None, ("write_file", WRITE_HERMES.replace("mul", "div"))),
        False,
    ),
    (
        "arguments that are not JSON stay text",
        think("", None, ("write_file", '{"path": "calc.py"')),
        think("", None, ("write_file", '{"path":"calc.py"}')),
        False,
    ),
    (
        "reasoning dropped, content stripped, arguments re-serialized: all at once",
        think(" Adding mul.\n", "plan it", ("write_file", WRITE_MODEL)),
        think("Adding mul.", None, ("write_file", WRITE_HERMES)),
        True,
    ),
]


@pytest.mark.parametrize(
    ("generated", "incoming", "echo"),
    [pytest.param(g, i, e, id=name) for name, g, i, e in ECHO_CASES],
)
def test_echo_case_table(generated: dict, incoming: dict, echo: bool) -> None:
    assert is_echo(generated, incoming, None) is echo
    assert (echo_difference(generated, incoming, None) is None) is echo
