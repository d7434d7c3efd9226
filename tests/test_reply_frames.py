"""A long reply's delta frames made around their text once (`sse.text_frames`) are byte for byte
the frames `json.dumps` makes for each delta: generated texts (quotes, backslashes, controls,
non-ASCII, line separators), and whole Messages streams of text, thinking and tool calls."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tokentrail.adapter.protocols.anthropic import stream_events
from tokentrail.adapter.protocols.sse import _MARK, pieces, text_frames

TEXT = st.text(
    st.one_of(st.characters(), st.sampled_from(['"', "\\", "\n", "\0", "\u2028", "é", "😀"])),
    max_size=300,
)


def sse(event: str, data: dict[str, Any], ascii_only: bool = False) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=ascii_only)}\n\n".encode(
        "utf-8", "surrogatepass"
    )


@given(st.lists(TEXT, max_size=8), st.integers(0, 3), st.booleans())
def test_frames_made_around_their_text_are_the_frames_made_each(
    texts: list[str], index: int, ascii_only: bool
) -> None:
    def frame(text: str) -> bytes:
        delta = {"type": "text_delta", "text": text}
        return sse("content_block_delta", {"index": index, "delta": delta}, ascii_only)

    texts.append(_MARK)  # the mark as a text is a text like any other
    expected = b"".join(map(frame, texts))
    try:
        got = b"".join(text_frames(frame, texts))
    except UnicodeEncodeError:  # a lone surrogate: json.dumps's frame cannot be UTF-8 either
        got = b"unencodable"
        expected = b"unencodable"
    assert got == expected


def old_stream_events(response: dict[str, Any]) -> list[bytes]:
    """The Messages stream, one `json.dumps` per delta (as before `text_frames`)."""

    def ev(event: str, data: dict[str, Any]) -> bytes:
        return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

    start = {**response, "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": response["usage"]["input_tokens"], "output_tokens": 0}
    out = [ev("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(response["content"]):
        kind = block["type"]
        if kind == "text":
            head = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"]) or [""]]
        elif kind == "thinking":
            head = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": p} for p in pieces(block["thinking"]) or [""]
            ] + [{"type": "signature_delta", "signature": block.get("signature", "")}]
        else:
            head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            payload = json.dumps(block["input"], ensure_ascii=False)
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces(payload)]
        out.append(
            ev("content_block_start", {"type": "content_block_start", "index": index,
                                       "content_block": head})
        )  # fmt: skip
        for d in deltas:
            out.append(
                ev("content_block_delta", {"type": "content_block_delta", "index": index,
                                           "delta": d})
            )  # fmt: skip
        out.append(ev("content_block_stop", {"type": "content_block_stop", "index": index}))
    stop = {"stop_reason": response["stop_reason"], "stop_sequence": None}
    usage = {"output_tokens": response["usage"]["output_tokens"]}
    out.append(ev("message_delta", {"type": "message_delta", "delta": stop, "usage": usage}))
    out.append(ev("message_stop", {"type": "message_stop"}))
    return out


SAFE_TEXT = st.text(
    st.one_of(st.characters(blacklist_categories=("Cs",)), st.sampled_from(['"', "\\", "\n", "é"])),
    max_size=700,
)
BLOCK = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, SAFE_TEXT),
    st.builds(
        lambda t, s: {"type": "thinking", "thinking": t, "signature": s}, SAFE_TEXT, SAFE_TEXT
    ),
    st.builds(
        lambda n, v: {"type": "tool_use", "id": "toolu_1", "name": n, "input": {"v": v}},
        SAFE_TEXT,
        SAFE_TEXT,
    ),
)


@given(st.lists(BLOCK, max_size=4))
def test_a_messages_stream_is_the_stream_made_a_delta_at_a_time(content: list) -> None:
    response = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": content,
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 5},
    }
    assert b"".join(stream_events(response)) == b"".join(old_stream_events(response))
