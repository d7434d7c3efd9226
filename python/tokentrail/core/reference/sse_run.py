"""Reference of `rust/sse_run.rs`: where the complete events of one read of a server-sent-events
stream end, where every one of them is a single `data: ` line and a blank one and nothing else
is there (no comment, other field, CR or `[DONE]`), and how many there are."""

from __future__ import annotations

__all__ = ["sse_run"]

_OPEN, _SEP = b"data: ", b"\n\ndata: "


def sse_run(buf: bytes, max_event: int) -> tuple[int, int] | None:
    """`(end, events)` where `buf[:end]` is such a run holding `events` events, none and not
    what follows them over `max_event` bytes; None where `buf` is not of that shape."""
    end = buf.rfind(b"\n\n") + 2
    if end < 2 or not buf.startswith(_OPEN) or len(buf) - end > max_event or b"\r" in buf:
        return None
    body = buf[:end]
    seps = body.count(_SEP)
    # Every LF is one of the separators' or the last two; no event is over the bound (the
    # body's length bounds each); `[DONE]` goes the general way.
    if (
        body.count(b"\n") != 2 * seps + 2
        or len(body) - 8 > max_event
        or body.startswith(b"data: [DONE]\n")
        or b"\n\ndata: [DONE]\n" in body
    ):
        return None
    return end, seps + 1
