"""A chunked body's framing taken off a read at a time: the Rust core (`_core.http_chunks`)
against the reference (`core.reference.http_chunks`), and both against the body the chunks were
made from, on generated bodies (chunk sizes, extensions, trailers, bytes that look like framing)
cut into reads anywhere; broken framing refused by both alike."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokentrail import _core
from tokentrail.core import reference
from tokentrail.errors import ChunkedBodyError

DATA = st.binary(min_size=1, max_size=40) | st.sampled_from([b"\r\n", b"0\r\n\r\n", b"\n", b"5"])
EXTENSION = st.sampled_from([b"", b";a=b", b" ;x", b'\t;q="1;2"'])
TRAILERS = st.lists(st.sampled_from([b"Expires: 0", b"X-A: b;c", b"T:"]), max_size=2)


@st.composite
def chunked(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A chunked body and the data it carries."""
    pieces = draw(st.lists(DATA, max_size=6))
    wire = b""
    for piece in pieces:
        size = format(len(piece), draw(st.sampled_from(["x", "X", "04x"])))
        wire += size.encode() + draw(EXTENSION) + b"\r\n" + piece + b"\r\n"
    trailers = b"".join(t + b"\r\n" for t in draw(TRAILERS))
    return wire + b"0" + draw(EXTENSION) + b"\r\n" + trailers + b"\r\n", b"".join(pieces)


def read_in(impl: object, wire: bytes, cuts: list[int]) -> tuple[bytes, int]:
    """The data of `wire` read in pieces cut at `cuts` (what a read leaves goes with the next),
    and where the body ended."""
    take = impl.http_chunks  # type: ignore[attr-defined]
    body, left, carry, at = b"", 0, b"", 0
    for end in [*sorted(cuts), len(wire)]:
        buf = carry + wire[at:end]
        at = max(at, end)
        got, taken, left, last = take(buf, left)
        body += got
        carry = buf[taken:]
        if last:
            return body, at - len(carry)
    raise AssertionError("no last chunk")


@given(chunked(), st.lists(st.integers(0, 400), max_size=5), st.binary(max_size=8))
def test_the_core_and_the_reference_read_a_body_cut_anywhere(
    body: tuple[bytes, bytes], cuts: list[int], after: bytes
) -> None:
    wire, data = body
    cuts = [c for c in cuts if c <= len(wire)]
    for impl in (_core, reference):
        assert read_in(impl, wire + after, cuts) == (data, len(wire))


@given(chunked(), st.integers(0, 400), st.binary(min_size=1, max_size=3), st.integers(0, 2))
def test_broken_framing_is_refused_alike(
    body: tuple[bytes, bytes], at: int, junk: bytes, left: int
) -> None:
    wire, _ = body
    at = min(at, len(wire))
    buf = wire[:at] + junk + wire[at:]
    answers = []
    for impl in (_core, reference):
        try:
            answers.append(impl.http_chunks(buf, left))  # type: ignore[attr-defined]
        except ChunkedBodyError as exc:
            answers.append(str(exc))
    assert answers[0] == answers[1]


@pytest.mark.parametrize(
    ("buf", "why"),
    [
        (b"5\r\nhelloX\r\n", "a chunk's data is not followed by CRLF"),
        (b"zz\r\n", "a chunk size is not a hex number"),
        (b"-5\r\n", "a chunk size is not a hex number"),
        (b"5 x\r\n", "a chunk size is not a hex number"),
        (b"5\n", "a chunk size line does not end with CRLF"),
        (b"0\r\nA: b\n\r\n", "a trailer line does not end with CRLF"),
        (b"f" * 20 + b"\r\n", "a chunk size is too large"),
        (b"1" * 9000, "a chunk size line is too long"),
        (b"0\r\n" + b"A: b\r\n" * 2000, "the trailer section is too long"),
    ],
)
def test_each_fault_is_named(buf: bytes, why: str) -> None:
    for impl in (_core, reference):
        with pytest.raises(ChunkedBodyError, match=why):
            impl.http_chunks(buf, 0)  # type: ignore[attr-defined]


def test_a_read_that_ends_in_a_size_line_or_the_trailers_takes_nothing_of_them() -> None:
    for impl in (_core, reference):
        assert impl.http_chunks(b"3\r\nabc\r\n1", 0) == (b"abc", 8, 0, False)  # type: ignore[attr-defined]
        assert impl.http_chunks(b"3\r\nabc\r\n0\r\nA: b\r\n", 0) == (b"abc", 8, 0, False)  # type: ignore[attr-defined]
        # Halfway through a chunk's data, and in the CRLF after it.
        assert impl.http_chunks(b"5\r\nab", 0) == (b"ab", 5, 5, False)  # type: ignore[attr-defined]
        assert impl.http_chunks(b"cde\r", 5) == (b"cde", 4, 1, False)  # type: ignore[attr-defined]
        assert impl.http_chunks(b"\n0\r\n\r\nrest", 1) == (b"", 6, 0, True)  # type: ignore[attr-defined]
