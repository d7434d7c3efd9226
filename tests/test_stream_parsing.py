"""Parsing as tokens arrive (`text.stream_parsing`): for every way of cutting a model's output
into pieces, the reasoning and content handed out piece by piece, plus what `finish` adds,
equal the whole parse (`parse_output`), in every family's markup; and the ids decoded run by
run with the real Qwen3 vocabulary equal `decode_turn` of all of them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support import fixtures
from tokentrail.text.parsing import format_output, parse_output
from tokentrail.text.stream_parsing import StreamDecoder, StreamParser
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer

# (tool parser, reasoning parser, whether the prompt opens the reasoning block)
FAMILIES = [
    ("hermes", "qwen3", False),
    ("qwen3_coder", "qwen3", False),
    ("hermes", None, False),
    (None, "qwen3", False),
    ("deepseek_v31", "deepseek_v3", True),
    ("glm45", "glm45", False),
    ("glm45", "glm47", True),
    ("kimi_k2", "kimi_k2", False),
    ("minimax_m2", "minimax_m2", True),
]
MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|tool_calls_section_begin|>")
words = st.sampled_from([*MARKUP, "\n", "\n\n", " ", "{", '"', "é", "日本", "<", "</"])
any_text = st.lists(st.text(max_size=6) | words, max_size=6).map("".join)
plain = any_text.filter(lambda s: not any(m in s for m in MARKUP) and "<" not in s)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
values = st.none() | st.booleans() | st.integers(-1000, 1000) | plain


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": draw(plain)}
    if draw(st.booleans()):
        message["reasoning_content"] = draw(plain)
    calls = draw(
        st.lists(
            st.builds(
                lambda n, a: {"type": "function", "function": {"name": n, "arguments": a}},
                names,
                st.dictionaries(names, values, max_size=3),
            ),
            max_size=2,
        )
    )
    if calls:
        message["tool_calls"] = calls
    return message


def streamed(
    text: str, cuts: list[int], tool: str | None, reasoning: str | None, opens: bool = True
) -> None:
    """Feed `text` cut at `cuts`; what went out must be a prefix of the whole parse at every
    step and, with `finish`, equal it."""
    whole = parse_output(text, tool, reasoning)
    final_r = whole.message.get("reasoning_content") or ""
    final_c = whole.message.get("content") or ""
    parser = StreamParser(tool, reasoning, prompt_opens=opens)
    got_r, got_c = "", ""
    bounds = [0, *sorted(set(cuts)), len(text)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        out = parser.feed(text[a:b])
        if out.content:
            assert out.reasoning == "" or got_c == ""
        got_r += out.reasoning
        got_c += out.content
        if not whole.ill_formed:
            assert final_r.startswith(got_r), (text, a, b)
            assert final_c.startswith(got_c), (text, a, b)
            if got_c:
                assert got_r == final_r  # reasoning was complete before content went out
    rest, ok = parser.finish(whole.message)
    if whole.ill_formed:
        return
    assert ok
    assert got_r + rest.reasoning == final_r
    assert got_c + rest.content == final_c


@settings(max_examples=400, deadline=None)
@given(messages(), st.sampled_from(FAMILIES), st.data())
def test_streamed_parse_equals_the_whole_parse(message: dict[str, Any], family, data) -> None:
    tool, reasoning, opened = family
    if tool is None:
        message.pop("tool_calls", None)
    if reasoning is None:
        message.pop("reasoning_content", None)
    fmt_tool = tool or "hermes"
    text = format_output(message, fmt_tool, reasoning, opened=opened)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    streamed(text, cuts, tool, reasoning)
    if not opened:
        # A family whose prompt never opens the block: content streams from its first token.
        streamed(text, cuts, tool, reasoning, opens=False)


@settings(max_examples=300, deadline=None)
@given(any_text, st.sampled_from(FAMILIES), st.data())
def test_arbitrary_output_streams_a_prefix_of_its_parse(text: str, family, data) -> None:
    tool, reasoning, _ = family
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    streamed(text, cuts, tool, reasoning)


def claude_code_outputs() -> list[str]:
    """What a Qwen3 model writes for each assistant turn of a real Claude Code session, with
    reasoning before it."""
    request = fixtures.load(fixtures.CLAUDE_CODE)["exchanges"][-1]["request"]
    texts = []
    for m in request["messages"]:
        if m["role"] != "assistant" or not isinstance(m["content"], list):
            continue
        content = "".join(b.get("text", "") for b in m["content"] if b["type"] == "text")
        calls = [
            {"type": "function", "function": {"name": b["name"], "arguments": b["input"]}}
            for b in m["content"]
            if b["type"] == "tool_use"
        ]
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "reasoning_content": "The user wants this done; check the file first.\n\nThen act.",
        }
        if calls:
            message["tool_calls"] = calls
        texts.append(format_output(message, "hermes", "qwen3"))
    return texts


def test_every_split_of_real_claude_code_outputs() -> None:
    texts = claude_code_outputs()
    assert len(texts) >= 3
    for text in texts:
        for cut in range(len(text) + 1):
            streamed(text, [cut], "hermes", "qwen3")
        streamed(text, list(range(len(text))), "hermes", "qwen3")  # one character at a time


def test_content_goes_out_before_the_turn_ends() -> None:
    parser = StreamParser("hermes", "qwen3")
    assert parser.feed("<think>\nLet me").reasoning == "Let me"
    assert parser.feed(" look.\n</thi").reasoning == " look."
    out = parser.feed("nk>\n\nHere is <tool_")
    assert (out.reasoning, out.content) == ("", "Here is ")
    assert parser.feed("call>\n{").content == ""  # a call: nothing more until the end


def test_content_streams_at_once_when_the_prompt_cannot_open_a_block() -> None:
    parser = StreamParser("hermes", "qwen3", prompt_opens=False)
    assert parser.feed("Sure, here").content == "Sure, here"
    assert StreamParser("hermes", "qwen3").feed("Sure, here").content == ""


def test_a_block_the_prompt_opened_is_held_until_it_closes() -> None:
    parser = StreamParser("deepseek_v31", "deepseek_v3")
    assert not parser.feed("Thinking about it")
    out = parser.feed("</think>Answer")
    assert (out.reasoning, out.content) == ("Thinking about it", "Answer")


@pytest.fixture(scope="module")
def qwen3() -> LoadedTokenizer:
    return load_tokenizer("builtin:qwen3")


@settings(max_examples=60, deadline=None)
@given(
    st.text(max_size=60) | st.sampled_from(["日本語のテキスト😀", "<think>\nx\n</think>"]),
    st.data(),
)
def test_decoding_run_by_run_equals_decoding_the_turn(qwen3, text: str, data) -> None:
    ids = qwen3.encode(text) + list(qwen3.end_token_ids)[:1]
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(ids)), max_size=10))))
    decoder = StreamDecoder(qwen3)
    got = ""
    bounds = [0, *cuts, len(ids)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        piece = decoder.feed(ids[a:b])
        assert "\ufffd" not in piece or "\ufffd" in text
        got += piece
    got += decoder.finish()
    assert got == qwen3.decode_turn(ids)
    json.dumps(got)  # whole characters only
