"""Where a read's run of single-line `data: ` events ends: the Rust core's one pass
(`_core.sse_run`) against the reference (`core.reference.sse_run`, the checks the engine client
made in Python before), on generated reads: runs of events, with blank lines, comments, other
fields, CR, `[DONE]` (which ends a run before it), events cut short and bounds that some events
pass."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tokentrail import _core
from tokentrail.core import reference

PIECES = st.sampled_from(
    [b"data: ", b"data:", b"\n", b"\n\n", b"\r", b"[DONE]", b'{"a": 1}', b"x", b": c", b"event: e"]
)
EVENT = st.sampled_from([b'{"a": 1}', b"x", b"", b"[DONE]", b"[DONE]x", b'{"t": "\\n"}'])


@st.composite
def reads(draw: st.DrawFn) -> bytes:
    """A run of events, then pieces anywhere in it and after it."""
    events = draw(st.lists(EVENT, max_size=6))
    buf = b"".join(b"data: " + e + b"\n\n" for e in events)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(buf)))
        buf = buf[:at] + draw(PIECES) + buf[at:]
    return buf + b"".join(draw(st.lists(PIECES, max_size=3)))


@given(reads(), st.integers(0, 64))
def test_the_core_cuts_a_read_where_the_reference_does(buf: bytes, max_event: int) -> None:
    assert _core.sse_run(buf, max_event) == reference.sse_run(buf, max_event)


@given(st.lists(EVENT.filter(lambda e: not e.startswith(b"[DONE]")), min_size=1), st.binary())
def test_a_run_of_plain_events_is_cut_after_its_last_blank_line(
    events: list[bytes], tail: bytes
) -> None:
    body = b"".join(b"data: " + e + b"\n\n" for e in events)
    tail = tail.replace(b"\n\n", b"").replace(b"\r", b"").rstrip(b"\n")
    got = _core.sse_run(body + tail, 1 << 20)
    assert got == reference.sse_run(body + tail, 1 << 20)
    if not tail.startswith(b"\n"):
        assert got == (len(body), len(events), False)
    done = body + b"data: [DONE]\n\n" + tail
    assert _core.sse_run(done, 1 << 20) == (len(body), len(events), True)
    assert reference.sse_run(done, 1 << 20) == (len(body), len(events), True)
