"""Reference of `rust/sse_run.rs`: where the complete events of one read of a server-sent-events
stream end, where every one of them is a single `data: ` line and a blank one and nothing else
is there (no comment, other field or CR), and how many there are; a `[DONE]` event ends the
run before it."""

from __future__ import annotations

__all__ = ["sse_run"]

_OPEN, _SEP = b"data: ", b"\n\ndata: "


def sse_run(buf: bytes, max_event: int) -> tuple[int, int, bool] | None:
    """`(end, events, done)` where `buf[:end]` is such a run holding `events` events, none and
    not what follows them over `max_event` bytes, and `done` where a `[DONE]` event ends it;
    None where `buf` is not of that shape."""
    end = buf.rfind(b"\n\n") + 2
    if end < 2 or not buf.startswith(_OPEN) or len(buf) - end > max_event or b"\r" in buf:
        return None
    body = buf[:end]
    # An event of n bytes counts n + 1 against the bound (its LF), as the line reader counts it.
    if len(body) - 7 > max_event:
        return None
    if body.startswith(b"data: [DONE]\n\n"):
        return 0, 0, True
    done = body.find(b"\n\ndata: [DONE]\n\n")
    if done >= 0:
        body = body[: done + 2]
    seps = body.count(_SEP)
    # Every LF is one of the separators' or the last two.
    if body.count(b"\n") != 2 * seps + 2:
        return None
    return len(body), seps + 1, done >= 0
