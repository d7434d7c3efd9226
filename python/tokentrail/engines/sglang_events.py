"""SGLang's stream events read fast. A run of events that each add only new tokens (the bytes
of one read) is read at once by the core (`core.sglang_run`: Rust, the GIL let go, no object
per event); one event at a time, they are typed by msgspec (ids and logprobs checked in C, no
dict per event); and of a cumulative event (SGLang's default stream repeats every token so far
in every event) only what follows the entries already taken is decoded: its `output_ids` and
`output_token_logprobs` are taken as raw JSON, and where they begin with the bytes of the last
event taken, only the rest is read.

An event this reader does not take (another shape, an error, a count that does not add up)
is left to `sglang.StreamCapture.take`, the reference it is held to (the same ids, logprobs,
entries and errors, by a differential test).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from tokentrail.core.backend import load_backend
from tokentrail.engines.streaming import RUN_END, RUN_OPEN, RUN_SEP, Event, Run

__all__ = ["FastEvents"]


class _Meta(msgspec.Struct):
    output_token_logprobs: msgspec.Raw
    completion_tokens: int


class _Event(msgspec.Struct):
    meta_info: _Meta
    output_ids: msgspec.Raw = msgspec.Raw()
    # Present at all, the reference reader raises the engine's error.
    error: msgspec.Raw = msgspec.Raw()


class _TypedMeta(msgspec.Struct):
    # `[logprob, token_id, text|null]`; anything else is the reference reader's to refuse.
    output_token_logprobs: list[tuple[float, int, Any]]
    completion_tokens: int


class _Typed(msgspec.Struct):
    """An event read whole, typed: while the stream is not known to be cumulative (its events
    are small, and an incremental stream's stay so)."""

    meta_info: _TypedMeta
    output_ids: list[int] | None = None
    error: msgspec.Raw = msgspec.Raw()


_HEAD = msgspec.json.Decoder(_Event)
_TYPED = msgspec.json.Decoder(_Typed)
_ENTRIES = msgspec.json.Decoder(list[tuple[float, int, Any]])
_IDS = msgspec.json.Decoder(list[int])
_WHOLE = msgspec.json.Decoder()


class Capture(Protocol):
    """What `FastEvents` reads and adds to (`sglang.StreamCapture`)."""

    ids: list[int]
    cumulative: bool
    limit: int

    def add(self, last: Any, ids: list[int], logprobs: list[float]) -> None: ...


class FastEvents:
    """The events of one stream that take the fast path, into `capture`."""

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.core = load_backend()
        # The raw `output_token_logprobs` / `output_ids` of the last event taken less their
        # closing `]`, where they held every entry (id) so far; else None.
        self.entries_head: bytes | None = None
        self.ids_head: bytes | None = None

    def forget(self) -> None:
        """An event went the reference way: the next one starts afresh."""
        self.entries_head = self.ids_head = None

    def take(self, event: Event) -> bool:
        """Take `event` into the capture; False (the capture untouched) where the reference
        reader must."""
        if not self.capture.cumulative:
            return self._take_typed(event)
        try:
            head = _HEAD.decode(event)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        if len(head.error):
            return False
        cap = self.capture
        total = head.meta_info.completion_tokens
        have = len(cap.ids)
        raw = bytes(head.meta_info.output_token_logprobs)
        try:
            new = self._suffix(raw, self.entries_head, _ENTRIES)
            if new is not None:
                n = have + len(new)  # the event repeats the `have` entries taken
            else:
                entries = _ENTRIES.decode(raw)
                n = len(entries)
            if n == total and total >= have:
                new = entries[have:] if new is None else new
                cumulative = have > 0 and total > 0
            elif new is None and have + n == total:
                new = entries
                cumulative = False
            else:
                return False
            ids = [entry[1] for entry in new]
            every = self._output_ids(head.output_ids, ids)
        except msgspec.ValidationError:
            return False
        if every is None:
            return False
        cap.ids.extend(ids)
        cap.cumulative = cap.cumulative or cumulative
        self.entries_head = raw[:-1] if n == total and raw.endswith(b"]") else None
        cap.add(event, ids, [entry[0] for entry in new])
        return True

    def take_incremental_run(self, events: Sequence[Event]) -> bool:
        """Take a run of events that each add only new tokens (an incremental stream, or one
        not yet known to be cumulative) together, as one event: True where every event is of
        that kind (the plain shape `core.sglang_run` reads, counts that add up, the run within
        the token limit), else False with the capture untouched, for `take` to read them one
        at a time."""
        cap = self.capture
        if cap.cumulative:
            return False
        # The bytes read, as they came (a `Run`), else the events joined as they would have.
        body = events.body if isinstance(events, Run) else RUN_OPEN + RUN_SEP.join(events) + RUN_END
        taken = self.core.sglang_run(body, len(cap.ids))
        if taken is None:
            return False
        ids, logprobs = taken
        if len(cap.ids) + len(ids) > cap.limit:
            return False  # the reference names the event that went over
        cap.ids.extend(ids)
        self.forget()
        cap.add(events[-1:][0], ids, logprobs)  # (a `Run` cuts out its last event alone)
        return True

    def _take_typed(self, event: Event) -> bool:
        try:
            typed = _TYPED.decode(event)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        if len(typed.error):
            return False
        cap = self.capture
        entries = typed.meta_info.output_token_logprobs
        total = typed.meta_info.completion_tokens
        have, n = len(cap.ids), len(entries)
        if n == total and total >= have:
            new = entries[have:]
            cumulative = have > 0 and total > 0
        elif have + n == total:
            new, cumulative = entries, False
        else:
            return False
        ids = [entry[1] for entry in new]
        out = typed.output_ids
        if out is not None and out != ids:
            known = len(cap.ids)
            if not (len(out) == known + len(ids) and out[known:] == ids and out[:known] == cap.ids):
                return False
        cap.ids.extend(ids)
        cap.cumulative = cap.cumulative or cumulative
        self.forget()  # the next cumulative event is read whole, and its bytes kept
        cap.add(event, ids, [entry[0] for entry in new])
        return True

    def _output_ids(self, value: msgspec.Raw, ids: list[int]) -> bool | None:
        """Whether `output_ids` agree with the entries (all ids so far, or the new ones), None
        where they do not (or are not ids); sets `ids_head` for the next event."""
        raw = bytes(value)
        if not raw or raw == b"null":
            self.ids_head = None
            return True
        cap = self.capture
        suffix = self._suffix(raw, self.ids_head, _IDS)
        if suffix is not None:
            every = suffix == ids  # the head held every id so far
        else:
            out = _IDS.decode(raw)
            have = len(cap.ids)
            every = len(out) == have + len(ids) and out[have:] == ids and out[:have] == cap.ids
            if not every and out != ids:
                return None
        if suffix is not None and not every:
            return None
        self.ids_head = raw[:-1] if every and raw.endswith(b"]") else None
        return every

    @staticmethod
    def _suffix(raw: bytes, head: bytes | None, decoder: Any) -> Sequence[Any] | None:
        """What follows `head` in the array `raw`, decoded; None where `raw` does not begin
        with `head` (or with a value after it)."""
        if head is None or not raw.startswith(head):
            return None
        rest = raw[len(head) :]
        if rest == b"]":
            return []
        if not rest.startswith(b","):
            return None
        return decoder.decode(b"[" + rest[1:])

    @staticmethod
    def whole(event: Event) -> dict[str, Any]:
        """An event taken here, as JSON (the last one's `meta_info` ends the answer)."""
        return _WHOLE.decode(event)
