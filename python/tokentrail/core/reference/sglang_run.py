"""Reference of `rust/sglang_run.rs`: a run of SGLang stream events that each add only new
tokens, read as one from the bytes of one read (`data: ` + the events' JSON joined by
`\\n\\ndata: ` + `\\n\\n`).

An event is taken where it has exactly the plain shape: a JSON object whose `meta_info` is an
object with `output_token_logprobs` (rows `[logprob, id, text]`: a number, an integer that fits
64 bits, `null` or a string) and `completion_tokens` (such an integer); an `output_ids` that is
absent, `null` or an array of such integers; no `error` key; no key of these given twice.
Other keys are skipped. The run is taken where every event is, each event's count takes the
tokens so far to its `completion_tokens`, and each `output_ids` given is that event's own ids;
anything else is None, and the caller reads the events one at a time.

One difference is left: a skipped value nested deeper than the interpreter's recursion limit
(about a thousand levels) is past `json.loads`, so here the run is None, where the core (whose
skipping does not recurse) reads it.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["sglang_run"]

_OPEN, _SEP, _CLOSE = b"data: ", b"\n\ndata: ", b"\n\n"
_INT64 = 2**63
_EVENT_KEYS = {"meta_info", "output_ids"}
_META_KEYS = {"output_token_logprobs", "completion_tokens"}


class _Refused(Exception):
    pass


class _Object(dict[str, Any]):
    """A JSON object, with the keys it gave more than once."""

    twice: set[str]


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    out = _Object(pairs)
    keys = [k for k, _ in pairs]
    out.twice = {k for k in keys if keys.count(k) > 1} if len(out) < len(keys) else set()
    return out


def _refuse(_: str) -> object:
    raise _Refused  # NaN, Infinity: not JSON


def _integer(text: str) -> int | float:
    # `-0` is the float -0.0, as the core's JSON reader reads it: a logprob, not an id or count.
    return -0.0 if text == "-0" else int(text)


def _int(value: Any) -> int:
    if type(value) is not int or not -_INT64 <= value < _INT64:
        raise _Refused
    return value


def _float(value: Any) -> float:
    if type(value) is int:
        try:
            value = float(value)
        except OverflowError:
            raise _Refused from None
    if type(value) is not float or not math.isfinite(value):
        raise _Refused
    return value


def _text(value: Any) -> str | None:
    if value is not None and type(value) is not str:
        raise _Refused
    if value is not None:
        value.encode()  # a lone surrogate (`\\ud800`) is no text
    return value


def _event(text: str) -> tuple[list[tuple[float, int, str | None]], int, list[int] | None]:
    event = json.loads(text, object_pairs_hook=_object, parse_constant=_refuse, parse_int=_integer)
    if type(event) is not _Object or "error" in event or event.twice & _EVENT_KEYS:
        raise _Refused
    meta = event["meta_info"]
    if type(meta) is not _Object or meta.twice & _META_KEYS:
        raise _Refused
    if type(meta["output_token_logprobs"]) is not list:
        raise _Refused
    entries = []
    for row in meta["output_token_logprobs"]:
        if type(row) is not list or len(row) != 3:
            raise _Refused
        entries.append((_float(row[0]), _int(row[1]), _text(row[2])))
    out = event.get("output_ids")
    if out is not None:
        if type(out) is not list:
            raise _Refused
        out = [_int(i) for i in out]
    return entries, _int(meta["completion_tokens"]), out


def sglang_run(body: bytes, have: int) -> tuple[list[int], list[float]] | None:
    """`(ids, logprobs)` of the run whose bytes are `body`, after `have` tokens taken, or None
    where an event is not of the plain shape or the counts do not add up (a row's text is
    checked, not kept)."""
    if not (body.startswith(_OPEN) and body.endswith(_CLOSE)):
        return None
    entries: list[tuple[float, int, str | None]] = []
    total = have
    try:
        for raw in body[len(_OPEN) : -len(_CLOSE)].split(_SEP):
            new, count, out = _event(raw.decode())
            total += len(new)
            if total != count or (out is not None and out != [e[1] for e in new]):
                return None
            entries += new
    except (_Refused, ValueError, KeyError, RecursionError):
        return None
    return [e[1] for e in entries], [e[0] for e in entries]
