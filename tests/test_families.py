"""Every model family's output format: what its model writes parses back into the message, its
template renders exactly that text for the current turn, the documented raw outputs parse, bad
markup is ill-formed (never an exception), and a template is matched to its family."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentrail.text.chat_template import ChatTemplate, template_needs
from tokentrail.text.families import detect_family, families, family
from tokentrail.text.formats import reasoning_format_names, tool_format_names
from tokentrail.text.formats.base import json_type
from tokentrail.text.parsing import OutputFormatError, parse_output

FAMILIES = [f.name for f in families()]

# Text without markup characters: what a model writes between its format's tags.
WORDS = st.text(alphabet="abcxyz ABC019.,:;!?-_'\"é汉🙂\n\t", min_size=1, max_size=24)
TEXT = WORDS.map(str.strip)
NAMES = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,10}", fullmatch=True)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    WORDS,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(NAMES, inner, max_size=3)),
    max_leaves=6,
)
CALLS = st.builds(
    lambda name, args: {"type": "function", "function": {"name": name, "arguments": args}},
    NAMES,
    st.dictionaries(NAMES, VALUES, max_size=4),
)


@st.composite
def assistant_messages(draw: st.DrawFn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": draw(st.one_of(st.just(""), TEXT))}
    if draw(st.booleans()):
        message["reasoning_content"] = draw(TEXT)
    # Distinct tool names: untyped formats read a value by its tool's schema, one per name.
    calls = draw(st.lists(CALLS, max_size=3, unique_by=lambda c: c["function"]["name"]))
    if calls:
        message["tool_calls"] = calls
    return message


def schemas(message: dict[str, Any]) -> list[dict[str, Any]]:
    """Tool schemas declaring each argument as the type it has (XML formats need them)."""
    tools = []
    for call in message.get("tool_calls") or ():
        fn = call["function"]
        props = {k: {"type": json_type(v)} for k, v in fn["arguments"].items()}
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "parameters": {"type": "object", "properties": props},
                },
            }
        )
    return tools


# --- parse(format(message)) == message ------------------------------------------------------


@pytest.mark.parametrize("name", FAMILIES)
@settings(max_examples=40, deadline=None)
@given(message=assistant_messages(), call_index=st.integers(0, 50), compact=st.booleans())
def test_output_parses_back_into_the_message(
    name: str, message: dict[str, Any], call_index: int, compact: bool
) -> None:
    fam = family(name)
    expected = fam.representable(message)
    # Schemas for what the message can carry: a call the format drops has none to name.
    tools = schemas(dict(expected))
    text = fam.format_output(expected, call_index=call_index, compact=compact)
    parsed = parse_output(text, fam.tool_parser, fam.reasoning_parser, tools)
    assert not parsed.ill_formed, (parsed.reason, text)
    assert fam.canonical(parsed.message) == expected, text


# --- the template renders what the model writes ---------------------------------------------

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "Fix the tests."}
CALL_TURN = {
    "role": "assistant",
    "content": "Reading it.",
    "reasoning_content": "The test file first.",
    "tool_calls": [
        {"type": "function", "function": {"name": "Read", "arguments": {"file_path": "a.py"}}}
    ],
}
PLAIN_TURN = {"role": "assistant", "content": "All green.", "reasoning_content": "Done."}
# Templates that drop a final answer's reasoning as soon as it is in history (the current turn
# included); and those that render a turn without reasoning unlike the prompt that opened it.
DROPS_FINAL_REASONING = {"kimi-k2", "kimi-k2.5", "gpt-oss"}


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("turn", [CALL_TURN, PLAIN_TURN], ids=["calls", "plain"])
def test_the_template_renders_what_the_model_writes(name: str, turn: dict[str, Any]) -> None:
    fam = family(name)
    template = ChatTemplate(fam.template(), fam.call_id)
    if name in DROPS_FINAL_REASONING and not turn.get("tool_calls"):
        turn = {k: v for k, v in turn.items() if k != "reasoning_content"}
    message = fam.representable(turn)
    tools = schemas(message)
    prompt = template.render([SYSTEM, USER], tools, True)
    full = template.render([SYSTEM, USER, message], tools, False)
    written = prompt + fam.format_output(message)
    assert full.startswith(written), (full, written)
    # Then the turn's end as history writes it, or nothing when the next message's role
    # token ends the turn (GLM).
    rest = full[len(written) :]
    end = fam.history_end.get(fam.end_token(message), fam.end_token(message))
    assert rest.startswith(end) or rest == ""


# --- documented raw outputs -------------------------------------------------------------------

WEATHER = [
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
    {
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Tokyo", "days": 2}},
    },
]
WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]


def calls_message(content: str = "", reasoning: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    message["tool_calls"] = WEATHER
    return message


# The raw output of each family's model for the worked example of the research notes: two
# calls after the reasoning "Need both cities." (where the family reasons).
RAW_OUTPUTS = {
    "deepseek-v3.1": (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>'
        '{"city": "Tokyo", "days": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        calls_message(),
    ),
    "deepseek-v3.2": (
        "Need both cities.</think>\n\n<｜DSML｜function_calls>\n"
        '<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n"
        '<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Tokyo</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
        calls_message(reasoning="Need both cities."),
    ),
    "glm4.5": (
        "\n<think>Need both cities.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
        "<arg_value>Paris</arg_value>\n</tool_call>\n<tool_call>get_weather\n"
        "<arg_key>city</arg_key>\n<arg_value>Tokyo</arg_value>\n<arg_key>days</arg_key>\n"
        "<arg_value>2</arg_value>\n</tool_call>",
        calls_message(reasoning="Need both cities."),
    ),
    "glm4.7": (
        "Need both cities.</think><tool_call>get_weather<arg_key>city</arg_key>"
        "<arg_value>Paris</arg_value></tool_call><tool_call>get_weather<arg_key>city</arg_key>"
        "<arg_value>Tokyo</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call>",
        calls_message(reasoning="Need both cities."),
    ),
    "kimi-k2": (
        "<think>Need both cities.</think><|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
        "<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>"
        '{"city": "Tokyo", "days": 2}<|tool_call_end|><|tool_calls_section_end|>',
        calls_message(reasoning="Need both cities."),
    ),
    "minimax-m2": (
        'Need both cities.\n</think>\n\n<minimax:tool_call>\n<invoke name="get_weather">\n'
        '<parameter name="city">Paris</parameter>\n</invoke>\n<invoke name="get_weather">\n'
        '<parameter name="city">Tokyo</parameter>\n<parameter name="days">2</parameter>\n'
        "</invoke>\n</minimax:tool_call>",
        calls_message(reasoning="Need both cities."),
    ),
    "qwen3.6": (
        "Need both cities.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
        "<function=get_weather>\n<parameter=city>\nTokyo\n</parameter>\n<parameter=days>\n2\n"
        "</parameter>\n</function>\n</tool_call>",
        calls_message(reasoning="Need both cities."),
    ),
    "nemotron3": (
        "Need both cities.</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
        "Paris\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nTokyo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n"
        "</tool_call>\n",
        calls_message(reasoning="Need both cities."),
    ),
    # The model writes one call per sample; the recipient may stand before the channel.
    "gpt-oss": (
        "<|channel|>analysis<|message|>Need both cities.<|end|><|start|>assistant"
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Paris"}',
        {**calls_message(reasoning="Need both cities."), "tool_calls": WEATHER[:1]},
    ),
    "llama3": (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_weather", "arguments": {"city": "Tokyo", "days": 2}}',
        calls_message(),
    ),
}


@pytest.mark.parametrize("name", sorted(RAW_OUTPUTS))
def test_documented_raw_outputs_parse(name: str) -> None:
    fam = family(name)
    text, expected = RAW_OUTPUTS[name]
    parsed = parse_output(text, fam.tool_parser, fam.reasoning_parser, WEATHER_TOOLS)
    assert parsed.ill_formed is False, parsed.reason
    assert parsed.message == expected


def test_llama3_plain_text_and_json_answers_are_not_calls() -> None:
    for text in ["The answer is 4.", '{"answer": 4}', "{not json"]:
        assert parse_output(text, "llama3_json", None).message == {
            "role": "assistant",
            "content": text,
        }


def test_harmony_preamble_and_final() -> None:
    text = (
        "<|channel|>analysis<|message|>plan<|end|><|start|>assistant<|channel|>commentary"
        "<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.Bash "
        '<|constrain|>json<|message|>{"command":"ls"}'
    )
    assert parse_output(text, "harmony", "harmony").message == {
        "role": "assistant",
        "content": "Checking.",
        "reasoning_content": "plan",
        "tool_calls": [
            {"type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}
        ],
    }
    final = "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>Hi"
    assert parse_output(final, "harmony", None).message == {"role": "assistant", "content": "x\nHi"}


# Bad markup in every format: ill-formed, the whole text kept as content.
ILL_FORMED = {
    "deepseek_v31": [
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{bad",
        "x<｜tool▁calls▁begin｜>",
    ],
    "deepseek_v32": [
        '\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n',
        "<｜DSML｜function_calls>x",
    ],
    "glm45": ["<tool_call>f\n<arg_key>a</arg_key>\n", "<tool_call>\n</tool_call>"],
    "glm47": ["<tool_call>f<arg_key>a</arg_key>x</tool_call>", "<tool_call>f</tool_call>tail"],
    "kimi_k2": ["<|tool_calls_section_begin|><|tool_call_begin|>f<|tool_call_argument_begin|>{}"],
    "minimax_m2": [
        '<minimax:tool_call>\n<invoke name="f">\n<parameter name="a">1',
        "<minimax:tool_call>",
    ],
    "harmony": ["plain text", "<|channel|>analysis<|message|>x<|end|><|start|>assistant"],
    "llama3_json": ['<|python_tag|>{"name": "f"}', '{"name": "f", "parameters": {}} and more'],
    "nemotron3": ["<tool_call>\n<function=f>\n<parameter=a>\n1\n"],
}


@pytest.mark.parametrize("fmt", sorted(ILL_FORMED))
def test_bad_markup_is_ill_formed_never_an_exception(fmt: str) -> None:
    for text in ILL_FORMED[fmt]:
        parsed = parse_output(text, fmt, None)
        assert parsed.ill_formed, text
        assert parsed.message == {"role": "assistant", "content": text}


def test_every_format_is_registered_and_unknown_names_say_which_exist() -> None:
    assert {f.tool_parser for f in families()} <= set(tool_format_names())
    assert {f.reasoning_parser for f in families()} - {None} <= set(reasoning_format_names())
    with pytest.raises(OutputFormatError, match="known: deepseek_v31"):
        parse_output("x", "glm5")
    with pytest.raises(OutputFormatError, match="kimi_k2"):
        parse_output("x", "hermes", "glm5")


def test_writers_refuse_what_a_format_cannot_carry() -> None:
    two = calls_message()
    with pytest.raises(OutputFormatError):
        family("gpt-oss").format_output(two)  # one call per sample
    with pytest.raises(OutputFormatError):
        family("llama3").format_output({**two, "tool_calls": WEATHER[:1], "content": "Hi"})
    # what the family can carry: the first call, no text beside it
    assert family("llama3").representable({**two, "content": "Hi"}) == {
        "role": "assistant",
        "content": "",
        "tool_calls": WEATHER[:1],
    }


# --- templates and families -------------------------------------------------------------------


@pytest.mark.parametrize("name", FAMILIES)
def test_each_template_is_matched_to_its_family(name: str) -> None:
    # A variant on another family's template (Qwen3-VL on Qwen3's) is picked by name: its
    # template matches the family registered first with that template.
    first = next(f for f in families() if f.template_file == family(name).template_file)
    assert detect_family(family(name).template()) is first
    assert first is family(name) or family(name).vision is not None


def test_unknown_templates_match_no_family() -> None:
    assert detect_family("{{ messages[0].content }}") is None


def test_what_templates_need_is_probed() -> None:
    needs = {name: template_needs(family(name).template()) for name in FAMILIES}
    # DeepSeek V3.1 concatenates arguments as text; Kimi addresses results by call id.
    assert {n for n, need in needs.items() if need.arguments_as_text} == {"deepseek-v3.1"}
    assert {n for n, need in needs.items() if need.call_ids} == {"kimi-k2", "kimi-k2.5"}


def test_templates_get_arguments_as_text_and_positional_ids() -> None:
    kimi = family("kimi-k2")
    messages = [
        USER,
        calls_message(),
        {"role": "tool", "content": "18"},
        {"role": "tool", "content": "25"},
    ]
    shaped = ChatTemplate(kimi.template(), kimi.call_id).shaped(messages, first_call_index=4)
    assert [c["id"] for c in shaped[1]["tool_calls"]] == [
        "functions.get_weather:4",
        "functions.get_weather:5",
    ]
    assert [m["tool_call_id"] for m in shaped[2:]] == [
        "functions.get_weather:4",
        "functions.get_weather:5",
    ]
    rendered = ChatTemplate(kimi.template(), kimi.call_id).render(messages)
    assert "## Return of functions.get_weather:1\n25" in rendered
    v31 = ChatTemplate(family("deepseek-v3.1").template())
    text = v31.render([USER, calls_message()], add_generation_prompt=False)
    assert '<｜tool▁sep｜>{"city": "Tokyo", "days": 2}<｜tool▁call▁end｜>' in text
    # The internal format keeps dict arguments; only the template sees text.
    assert isinstance(calls_message()["tool_calls"][0]["function"]["arguments"], dict)


def test_deepseek_v3_1_continues_straight_after_tool_outputs() -> None:
    v31 = ChatTemplate(family("deepseek-v3.1").template())
    text = v31.render([USER, calls_message(), {"role": "tool", "content": "18"}])
    assert text.endswith("<｜tool▁output▁begin｜>18<｜tool▁output▁end｜>")


def test_unknown_family_names_say_which_exist() -> None:
    from tokentrail.errors import TokenizerError

    with pytest.raises(TokenizerError, match="gpt-oss"):
        family("gemini")
    assert family("glm4.6") is family("glm4.5")
    assert family("qwen3.5") is family("qwen3.6")
    assert json.dumps(sorted(FAMILIES))
