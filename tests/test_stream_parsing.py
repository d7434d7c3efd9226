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
from tokentrail.adapter.protocols import protocols
from tokentrail.adapter.protocols.base import fill_call_ids
from tokentrail.adapter.protocols.outcome import Outcome
from tokentrail.text import stream_parsing
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
    ("nemotron3", "nemotron_v3", True),
]
# The formats whose calls stream as sampled (`text.stream_calls`); the rest give them at the end.
STREAMING_CALLS = ("hermes", "qwen3_coder", "nemotron3")
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
    text: str,
    cuts: list[int],
    tool: str | None,
    reasoning: str | None,
    opens: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> list[list[str]]:
    """Feed `text` cut at `cuts`; what went out must be a prefix of the whole parse at every
    step and, with `finish`, equal it: reasoning, content, and each call's name and arguments
    (the fragments joined are the reply's arguments string byte for byte, and parse to the
    whole parse's arguments). Returns each call's fragments as they went out while fed."""
    whole = parse_output(text, tool, reasoning, tools=tools)
    final_r = whole.message.get("reasoning_content") or ""
    final_c = whole.message.get("content") or ""
    final_calls = [
        (c["function"]["name"], json.dumps(c["function"]["arguments"], ensure_ascii=False))
        for c in whole.message.get("tool_calls") or ()
    ]
    parser = StreamParser(tool, reasoning, prompt_opens=opens, tools=tools)
    got_r, got_c = "", ""
    names: list[str] = []
    fragments: list[list[str]] = []
    bounds = [0, *sorted(set(cuts)), len(text)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        out = parser.feed(text[a:b])
        if out.content:
            assert out.reasoning == "" or got_c == ""
        if out.calls:
            assert not fragments or (out.reasoning, out.content) == ("", "")
        for call in out.calls:
            if call.name:
                assert call.index == len(names)
                names.append(call.name)
                fragments.append([])
            fragments[call.index].append(call.arguments)
        got_r += out.reasoning
        got_c += out.content
        if not whole.ill_formed:
            assert final_r.startswith(got_r), (text, a, b)
            assert final_c.startswith(got_c), (text, a, b)
            if got_c:
                assert got_r == final_r  # reasoning was complete before content went out
            if names:
                # Calls go out after the content is whole.
                assert (got_r, got_c) == (final_r, final_c), (text, a, b)
            assert len(names) <= len(final_calls)
            sent = zip(final_calls, names, fragments, strict=False)
            for (name, arguments), got_name, got in sent:
                assert got_name == name
                assert arguments.startswith("".join(got)), (text, a, b)
    rest, ok = parser.finish(whole.message)
    if whole.ill_formed:
        return fragments
    assert ok, text
    assert got_r + rest.reasoning == final_r
    assert got_c + rest.content == final_c
    joined = ["".join(f) for f in fragments] + [""] * (len(final_calls) - len(fragments))
    for call in rest.calls:
        if call.index >= len(names):
            names.append(call.name)
        joined[call.index] += call.arguments
    assert names == [name for name, _ in final_calls]
    assert joined == [arguments for _, arguments in final_calls]
    for got, call in zip(joined, whole.message.get("tool_calls") or (), strict=True):
        assert json.loads(got) == call["function"]["arguments"]
    return fragments


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


# Argument values with what JSON escapes: quotes, backslashes, newlines, control characters,
# non-ASCII and characters beyond the BMP (a surrogate pair when escaped).
strings = st.text(
    st.sampled_from(['"', "\\", "\n", "\t", "\x01", "/", "é", "😀", "a", " ", "<", ">", "{"]),
    max_size=12,
)
scalars = st.none() | st.booleans() | st.integers(-(10**20), 10**20) | strings
scalars |= st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strings, inner, max_size=3),
    max_leaves=6,
)
calls_of = st.lists(
    st.tuples(names, st.dictionaries(names, json_values, max_size=4)), min_size=1, max_size=3
)


def schemas_for(calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Tools declaring each string argument a string (so XML calls stream it as sampled)."""
    tools: dict[str, dict[str, Any]] = {}
    for name, arguments in calls:
        props = {k: {"type": "string"} for k, v in arguments.items() if isinstance(v, str)}
        tools[name] = {"name": name, "parameters": {"type": "object", "properties": props}}
    return [{"type": "function", "function": t} for t in tools.values()]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(STREAMING_CALLS),
    st.sampled_from(["qwen3", None]),
    plain,
    calls_of,
    st.data(),
)
def test_streamed_call_arguments_equal_the_whole_parse_on_every_split(
    tool: str, reasoning: str | None, content: str, calls, data
) -> None:
    if tool == "nemotron3" and reasoning is not None:
        reasoning = "nemotron_v3"
    message: dict[str, Any] = {"role": "assistant", "content": content}
    message["tool_calls"] = [
        {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls
    ]
    if reasoning is not None:
        message["reasoning_content"] = "Thinking."
    tools = schemas_for(calls)
    text = format_output(message, tool, reasoning, opened=tool == "nemotron3")
    whole = parse_output(text, tool, reasoning, tools=tools)
    assert not whole.ill_formed and len(whole.message["tool_calls"]) == len(calls)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=16))
    streamed(text, cuts, tool, reasoning, tools=tools)
    # And one character at a time: every call's name and arguments went out before the end.
    fragments = streamed(text, list(range(len(text))), tool, reasoning, tools=tools)
    assert len(fragments) == len(calls)


# Formats whose calls go out call by call, each whole once its end is sampled.
WHOLE_CALLS = [
    ("glm45", "glm45", False),
    ("glm47", "glm47", True),
    ("kimi_k2", "kimi_k2", False),
    ("deepseek_v31", "deepseek_v3", True),
    ("deepseek_v32", "deepseek_v3", True),
    ("minimax_m2", "minimax_m2", True),
]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(WHOLE_CALLS), plain, calls_of, st.data())
def test_calls_of_other_formats_go_out_one_by_one_before_the_end(
    family, content: str, calls, data
) -> None:
    tool, reasoning, opened = family
    message: dict[str, Any] = {"role": "assistant", "content": content}
    message["reasoning_content"] = "Thinking."
    message["tool_calls"] = [
        {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls
    ]
    tools = schemas_for(calls)
    text = format_output(message, tool, reasoning, opened=opened)
    whole = parse_output(text, tool, reasoning, tools=tools)
    if whole.ill_formed or len(whole.message.get("tool_calls") or ()) != len(calls):
        return  # arguments this format cannot write (not what this test is about)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=16))
    streamed(text, cuts, tool, reasoning, opens=opened, tools=tools)
    fragments = streamed(text, list(range(len(text))), tool, reasoning, opens=opened, tools=tools)
    assert len(fragments) == len(calls)  # every call went out before the turn ended
    assert all(len(f) == 1 for f in fragments)  # each whole


@settings(max_examples=300, deadline=None)
@given(calls_of, st.booleans(), st.sampled_from([None, (",", ":"), (", ", ": "), 2]), st.data())
def test_hermes_json_written_any_way_streams_the_reply_arguments(
    calls, ascii_only: bool, layout, data
) -> None:
    """A model spaces and escapes its JSON as it likes (`{"a":1}`, `\\u00e9`, indented); the
    fragments are of the reply's arguments string all the same."""
    blocks = []
    for name, arguments in calls:
        indent = layout if isinstance(layout, int) else None
        separators = layout if isinstance(layout, tuple) else None
        args = json.dumps(arguments, ensure_ascii=ascii_only, indent=indent, separators=separators)
        order = data.draw(st.booleans())
        head = (
            f'{{"name": {json.dumps(name)}, "arguments": {args}}}'
            if order
            else f'{{"arguments": {args}, "name": {json.dumps(name)}}}'
        )
        blocks.append(f"<tool_call>\n{head}\n</tool_call>")
    text = "Let me look.\n" + "\n".join(blocks)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=16))
    streamed(text, cuts, "hermes", None)
    streamed(text, list(range(len(text))), "hermes", None)


def test_arguments_stream_before_the_call_closes() -> None:
    parser = StreamParser("hermes", "qwen3", prompt_opens=False)
    out = parser.feed('<tool_call>\n{"name": "Bash", "arguments": {"command": "pyt')
    assert [(c.index, c.name, c.arguments) for c in out.calls] == [
        (0, "Bash", ""),
        (0, "", '{"command": "pyt'),
    ]
    assert "".join(c.arguments for c in parser.feed('est -q", "n": 1').calls) == 'est -q", "n": '
    assert "".join(c.arguments for c in parser.feed("2}}\n</tool_call>").calls) == "12}"
    write = {"name": "Write", "parameters": {"properties": {"content": {"type": "string"}}}}
    xml = StreamParser("qwen3_coder", None, tools=[{"type": "function", "function": write}])
    out = xml.feed("<tool_call>\n<function=Write>\n<parameter=content>\nline 1\nline")
    assert "".join(c.arguments for c in out.calls) == '{"content": "line 1\\nline'
    out = xml.feed(" 2\n</parameter>\n<parameter=n>\n3")
    assert "".join(c.arguments for c in out.calls) == ' 2", "n": '  # 3 may go on: held
    out = xml.feed("\n</parameter>\n</function>\n</tool_call>")
    assert "".join(c.arguments for c in out.calls) == "3}"


def test_a_call_the_whole_parse_rejects_is_a_mismatch() -> None:
    text = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>\nmore'
    whole = parse_output(text, "hermes", None)
    assert whole.ill_formed
    parser = StreamParser("hermes", None)
    out = parser.feed(text)
    assert out.calls  # the call went out while it looked well formed
    rest, ok = parser.finish(whole.message)
    assert not ok and not rest.calls


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


@settings(max_examples=60, deadline=None)
@given(
    st.text(max_size=80) | st.sampled_from(["日本語のテキスト😀" * 4, "é\u0301 ☃ 𝄞 " * 6]),
    st.data(),
    st.integers(1, 4),
    st.integers(0, 6),
)
def test_decoding_with_short_windows_equals_decoding_the_turn(
    qwen3, text: str, data, context: int, window: int
) -> None:
    """The decoder's window restarted every few tokens, a few (at least one) back: the same
    text as the whole, characters split across tokens and runs included."""
    ids = qwen3.encode(text) + list(qwen3.end_token_ids)[:1]
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(ids)), max_size=20))))
    saved = stream_parsing.CONTEXT_TOKENS, stream_parsing.WINDOW_TOKENS
    stream_parsing.CONTEXT_TOKENS, stream_parsing.WINDOW_TOKENS = context, max(window, context)
    try:
        decoder = StreamDecoder(qwen3)
        bounds = [0, *cuts, len(ids)]
        got = "".join(decoder.feed(ids[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
        got += decoder.finish()
    finally:
        stream_parsing.CONTEXT_TOKENS, stream_parsing.WINDOW_TOKENS = saved
    assert got == qwen3.decode_turn(ids)


# -- what a harness assembles from a live stream ------------------------------------------------


def sse_data(frames: bytes) -> list[dict[str, Any]]:
    """The JSON of each `data:` frame (comments and `[DONE]` left out)."""
    out = []
    for frame in frames.split(b"\n\n"):
        for line in frame.split(b"\n"):
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


def assembled_anthropic(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Content blocks as the anthropic SDK builds them from the events."""
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    for e in events:
        if e["type"] == "content_block_start":
            assert e["index"] == len(blocks)
            blocks.append(dict(e["content_block"]))
        elif e["type"] == "content_block_delta":
            block, delta = blocks[e["index"]], e["delta"]
            if delta["type"] == "input_json_delta":
                partial[e["index"]] = partial.get(e["index"], "") + delta["partial_json"]
            elif delta["type"] == "signature_delta":
                block["signature"] += delta["signature"]
            else:
                key = "thinking" if delta["type"] == "thinking_delta" else "text"
                block[key] += delta[key]
    for index, text in partial.items():
        blocks[index]["input"] = json.loads(text)
    return blocks


def assembled_chat(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The message as the openai SDK's stream helpers build it from the chunks."""
    message: dict[str, Any] = {"role": "assistant", "content": "", "reasoning_content": ""}
    calls: dict[int, dict[str, Any]] = {}
    for e in events:
        if not e["choices"]:
            continue
        delta = e["choices"][0]["delta"]
        message["content"] += delta.get("content") or ""
        message["reasoning_content"] += delta.get("reasoning_content") or ""
        for call in delta.get("tool_calls") or ():
            entry = calls.setdefault(
                call["index"], {"id": call.get("id"), "type": "function", "name": "", "args": ""}
            )
            entry["name"] += call["function"].get("name") or ""
            entry["args"] += call["function"].get("arguments") or ""
    message["tool_calls"] = [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
        for _, c in sorted(calls.items())
    ]
    return message


def check_responses(events: list[dict[str, Any]], reply: dict[str, Any]) -> None:
    """Sequence numbers run on, every item goes out at its reply's index with its reply's id,
    its deltas make its reply's text, and `response.completed` carries the reply itself."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1] == {
        "type": "response.completed",
        "sequence_number": len(events) - 1,
        "response": reply,
    }
    output = reply["output"]
    added = [e for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [(e["output_index"], e["item"]["id"]) for e in added] == [
        (i, item["id"]) for i, item in enumerate(output)
    ]
    assert [e["item"] for e in done] == output
    texts: dict[str, str] = {}
    for e in events:
        if e["type"].endswith(".delta"):
            assert output[e["output_index"]]["id"] == e["item_id"]
            texts[e["item_id"]] = texts.get(e["item_id"], "") + e["delta"]
    for item in output:
        if item["type"] in ("reasoning", "message"):
            expected = item["content"][0]["text"]
        else:
            expected = item["arguments" if item["type"] == "function_call" else "input"]
        assert texts.get(item["id"], "") == expected


def live_frames(
    proto_name: str,
    body: dict[str, Any],
    text: str,
    cuts: list[int],
    tool: str,
    reasoning: str | None,
    tools: list[dict[str, Any]],
) -> tuple[bytes, dict[str, Any]]:
    """A protocol's live stream of `text` fed at `cuts`, and the reply the turn builds."""
    proto = next(p for p in protocols() if p.name == proto_name)
    whole = parse_output(text, tool, reasoning, tools=tools)
    parser = StreamParser(tool, reasoning, prompt_opens=False, tools=tools)
    live = proto.live(body, "reply_1", "m", 10)
    frames = live.open()
    bounds = [0, *sorted(set(cuts)), len(text)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        frames += live.delta(parser.feed(text[a:b]))
    calls = whole.message.get("tool_calls") or ()
    outcome = Outcome(
        "m",
        whole.message,
        fill_call_ids(proto, live.call_ids, len(calls)),
        "stop",
        10,
        20,
        reply_id="reply_1",
        body=body,
        item_ids=live.item_ids,
    )
    reply = proto.reply(outcome)
    rest, ok = parser.finish(whole.message)
    assert ok
    return frames + live.close(reply, rest), reply


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["hermes", "qwen3_coder", "glm45", "kimi_k2"]),
    st.booleans(),
    plain,
    calls_of,
    strings,
    st.data(),
)
def test_every_protocol_streams_the_reply_it_writes_on_every_split(
    tool: str, with_reasoning: bool, content: str, calls, patch: str, data
) -> None:
    """The message a harness assembles from a live stream (thinking, text, each tool call's id,
    name and arguments) is the reply the turn writes, for formats whose calls stream and for
    those whose calls come at the end; Responses' free-form `apply_patch` streams its input."""
    reasoning = {"hermes": "qwen3", "qwen3_coder": "qwen3"}.get(tool, tool)
    reasoning = reasoning if with_reasoning else None
    calls = [*calls, ("apply_patch", {"input": patch})]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = "Thinking it over."
    message["tool_calls"] = [
        {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls
    ]
    tools = schemas_for(calls)
    text = format_output(message, tool, reasoning)
    if parse_output(text, tool, reasoning, tools=tools).ill_formed:
        return  # a format that cannot write these arguments (not what this test is about)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))

    frames, reply = live_frames("anthropic", {}, text, cuts, tool, reasoning, tools)
    assert assembled_anthropic(sse_data(frames)) == reply["content"]

    chat_body = {"stream_options": {"include_usage": True}}
    frames, reply = live_frames("openai", chat_body, text, cuts, tool, reasoning, tools)
    want = dict(reply["choices"][0]["message"])
    got = assembled_chat(sse_data(frames))
    assert got["content"] == (want["content"] or "")
    assert got["reasoning_content"] == want.get("reasoning_content", "")
    assert got["tool_calls"] == want["tool_calls"]  # ids, names, arguments byte for byte

    declared = [
        {"type": "custom", "name": "apply_patch"}
        if t["function"]["name"] == "apply_patch"
        else {"type": "function", **t["function"]}
        for t in tools
    ]
    frames, reply = live_frames(
        "responses", {"tools": declared}, text, cuts, tool, reasoning, tools
    )
    check_responses(sse_data(frames), reply)
    assert reply["output"][-1]["type"] == "custom_tool_call"
    assert reply["output"][-1]["input"] == patch
