"""A run of SGLang stream events read at once by the Rust core (`_core.sglang_run`, the GIL let
go) exactly as the reference reads it, and as `json.loads` reads each event where the run is
taken; anything off the plain shape is left to the per-event reader.

Generated runs: events of the plain shape (other keys around them, keys in any order, floats in
every notation, texts with escapes, `output_ids` given, null or absent) and each of the ways an
event leaves it (a count that does not add up, an `error` key, `output_ids` that are not the
event's ids, a text that is a number, an id that is a float, a short row, a count given twice,
`meta_info` not an object, `NaN`, an id past 64 bits, a lone surrogate, an id written `-0`,
`output_ids` given twice), and the same broken a byte at a time.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from test_wire_numbers import float_text, same
from tokentrail import _core
from tokentrail.core import reference

SPACE = st.sampled_from(["", "", " ", "\t", "\r"])
TEXTS = st.one_of(st.none(), st.text(max_size=6), st.sampled_from(['a"b', "\\", "\n", "é", "🙂"]))
# How an event may leave the plain shape, by name.
FAULTS = [
    "count",
    "error",
    "other ids",
    "text a number",
    "float id",
    "short row",
    "twice",
    "meta a list",
    "nan",
    "huge id",
    "surrogate",
    "minus zero id",
    "ids twice",
]


def dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=bool(hash(str(value)) % 2))


@st.composite
def events(draw: st.DrawFn, have: int, faulty: bool) -> tuple[str, int]:
    """One event's JSON after `have` tokens, its count of new tokens; where `faulty`, now and
    then off the plain shape."""
    n = draw(st.integers(0, 4))
    ids = [draw(st.integers(0, 2**40)) for _ in range(n)]
    rows = []
    for token in ids:
        lp = float_text(draw(st.floats(-1e4, 0.0)), draw(st.integers(0, 2)))
        lp = draw(st.sampled_from([lp, lp, lp, "-0", "0"]))  # integers in a float's place
        rows.append(f"[{draw(SPACE)}{lp},{token},{dumps(draw(TEXTS))}]")
    meta = {
        "output_token_logprobs": "[" + ",".join(rows) + "]",
        "completion_tokens": str(have + n),
        "id": '"rid"',
        "finish_reason": "null",
        "input_token_logprobs": "[]",
        "error": '{"nested": 1}',  # inside meta_info: not the event's error
    }
    top = {"text": '"t\\u00e9"', "meta_info": "", "output_ids": dumps(ids)}
    if draw(st.booleans()):
        top["output_ids"] = draw(st.sampled_from(["null", "null" if n else "[]"]))
    if draw(st.booleans()) and top["output_ids"] == "null":
        del top["output_ids"]
    fault = draw(st.sampled_from(FAULTS)) if faulty and draw(st.integers(0, 5)) == 0 else None
    if fault == "count":
        meta["completion_tokens"] = str(have + n + draw(st.sampled_from([-1, 1])))
    elif fault == "error":
        top["error"] = draw(st.sampled_from(["null", '"boom"', "{}"]))
    elif fault == "other ids":
        top["output_ids"] = dumps([*ids, 7])
    elif fault == "text a number" and rows:
        rows[0] = rows[0].rsplit(",", 1)[0] + ",1]"
    elif fault == "float id" and rows:
        rows[0] = rows[0].replace(f",{ids[0]},", f",{ids[0]}.0,")
    elif fault == "short row" and rows:
        rows[0] = rows[0].rsplit(",", 1)[0] + "]"
    elif fault == "nan" and rows:
        rows[0] = "[NaN" + rows[0][rows[0].index(",") :]
    elif fault == "huge id" and rows:
        rows[0] = rows[0].replace(f",{ids[0]},", f",{2**64 + ids[0]},")
    elif fault == "surrogate" and rows:
        rows[0] = rows[0].rsplit(",", 1)[0] + ',"\\ud800"]'
    elif fault == "minus zero id" and rows:
        rows[0] = rows[0].replace(f",{ids[0]},", ",-0,")
    meta["output_token_logprobs"] = "[" + ",".join(rows) + "]"
    keys = list(meta)
    keys = draw(st.permutations(keys))
    meta_text = "{" + ",".join(f'"{k}":{draw(SPACE)}{meta[k]}' for k in keys) + "}"
    if fault == "twice":
        meta_text = meta_text[:-1] + f',"completion_tokens":{have + n}}}'
    if fault == "meta a list":
        meta_text = f"[{meta['output_token_logprobs']},{have + n}]"
    top["meta_info"] = meta_text
    order = draw(st.permutations(list(top)))
    obj = "{" + ",".join(f'"{k}": {top[k]}' for k in order) + "}"
    if fault == "ids twice":
        obj = obj[:-1] + f',"output_ids": {dumps(ids)}}}'
    text = draw(SPACE) + obj + draw(SPACE)
    return text, n


@st.composite
def runs(draw: st.DrawFn, faulty: bool = True) -> tuple[bytes, int]:
    have = draw(st.integers(0, 3))
    out, at = [], have
    for _ in range(draw(st.integers(1, 5))):
        text, n = draw(events(at, faulty))
        out.append(text)
        at += n
    return ("data: " + "\n\ndata: ".join(out) + "\n\n").encode(), have


@st.composite
def broken(draw: st.DrawFn) -> tuple[bytes, int]:
    body, have = draw(runs())
    at = draw(st.integers(0, len(body)))
    junk = draw(st.sampled_from([b"", b",", b"{", b"}", b"]", b'"', b"\\", b"\xff", b"\n\n"]))
    return body[:at] + junk + body[at + draw(st.integers(0, 2)) :], have


@given(st.one_of(runs(), broken()))
def test_the_core_reads_a_run_as_the_reference_does(run: tuple[bytes, int]) -> None:
    body, have = run
    assert same(_core.sglang_run(body, have), reference.sglang_run(body, have))


@given(runs(faulty=False))
def test_a_plain_run_is_taken_as_json_loads_reads_it_event_by_event(run: tuple[bytes, int]) -> None:
    body, have = run
    got = _core.sglang_run(body, have)
    assert got is not None
    # (A logprob written `-0` is -0.0, where `json.loads` makes it the int 0.)
    minus_zero = {"parse_int": lambda s: -0.0 if s == "-0" else int(s)}
    loaded = [json.loads(e, **minus_zero) for e in body[6:-2].split(b"\n\ndata: ")]
    entries = [tuple(r) for e in loaded for r in e["meta_info"]["output_token_logprobs"]]
    assert got[0] == [t for _, t, _ in entries]
    assert same(got[1], [float(lp) for lp, _, _ in entries])


@pytest.mark.parametrize("fault", FAULTS)
def test_each_way_off_the_plain_shape_is_left_to_the_per_event_reader(fault: str) -> None:
    event = json.dumps(
        {"meta_info": {"output_token_logprobs": [[-0.5, 5, None]], "completion_tokens": 1}}
    )
    bad = {
        "count": event.replace('"completion_tokens": 1', '"completion_tokens": 2'),
        "error": event[:-1] + ', "error": null}',
        "other ids": event[:-1] + ', "output_ids": [6]}',
        "text a number": event.replace("null", "1"),
        "float id": event.replace(" 5,", " 5.0,"),
        "short row": event.replace(", null]", "]"),
        "twice": event.replace("}}", ', "completion_tokens": 1}}'),
        "meta a list": '{"meta_info": [[[-0.5, 5, null]], 1]}',
        "nan": event.replace("-0.5", "NaN"),
        "huge id": event.replace(" 5,", f" {2**64},"),
        "surrogate": event.replace("null", '"\\ud800"'),
        "minus zero id": event.replace(" 5,", " -0,"),
        "ids twice": event[:-1] + ', "output_ids": [5], "output_ids": [5]}',
    }[fault]
    assert _core.sglang_run(f"data: {bad}\n\n".encode(), 0) is None
    assert reference.sglang_run(f"data: {bad}\n\n".encode(), 0) is None
    assert _core.sglang_run(f"data: {event}\n\n".encode(), 0) is not None


def test_a_run_longer_than_a_chunk_of_entries_is_read_whole() -> None:
    # The core makes the ids and logprobs 16,384 at a time, letting the interpreter go in
    # between.
    n = 40_000
    event = {"meta_info": {"output_token_logprobs": [], "completion_tokens": n}}
    event["meta_info"]["output_token_logprobs"] = [[-(i % 7) / 8, i, None] for i in range(n)]
    body = f"data: {json.dumps(event)}\n\n".encode()
    got = _core.sglang_run(body, 0)
    assert got is not None and same(got, reference.sglang_run(body, 0))
    assert got[0] == list(range(n))
