"""What the adapter learns about one request while answering it: its session, the engine
request id, the prompt and output token counts. The error middleware starts a request's notes,
the turn fills them in, and the log lines about the request (a 5xx's warning, the access log)
read them.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["RequestNotes", "begin", "current"]


@dataclass
class RequestNotes:
    session: str | None = None
    request_id: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None

    def where(self) -> str:
        """`session S, request R` for a log line, `-` for what is not known."""
        return f"session {self.session or '-'}, request {self.request_id or '-'}"


_CURRENT: ContextVar[RequestNotes | None] = ContextVar("tokentrail_request_notes", default=None)


def begin() -> RequestNotes:
    """Fresh notes for the request the running task now answers."""
    notes = RequestNotes()
    _CURRENT.set(notes)
    return notes


def current() -> RequestNotes:
    """The notes of the request being answered (throwaway ones outside any request)."""
    return _CURRENT.get() or RequestNotes()
