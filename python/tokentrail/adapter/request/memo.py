"""A session's previous request, kept so the next one parses and translates only what is new
(`request.parse`, `request.translate`): its bytes, their index, the parse and the translation,
for each of the most recent sessions.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokentrail.adapter.protocols.resume import Translated

if TYPE_CHECKING:
    from tokentrail import _core

__all__ = ["KnownRequest", "RequestMemo"]


@dataclass(frozen=True)
class KnownRequest:
    """A session's latest request: its bytes, their index, the parse and the translation."""

    protocol: str
    raw: bytes
    index: _core.BodyIndex
    body: dict[str, Any]
    translated: Translated | None = None
    # Whether its translated messages held no image to resolve (`text.vision.resolve_images`
    # left them as they were): the next request's messages that are the very same objects
    # need no look for images.
    plain: bool = False


class RequestMemo:
    """The latest request of each of the most recent sessions (at most `capacity`; 0: none).

    Per session, not shared: a body is only ever compared with its own session's previous one.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._known: OrderedDict[str, KnownRequest] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, sid: str | None) -> KnownRequest | None:
        if sid is None or not self.capacity:
            return None
        with self._lock:
            known = self._known.get(sid)
            if known is not None:
                self._known.move_to_end(sid)
            return known

    def put(self, sid: str, known: KnownRequest) -> None:
        if not self.capacity:
            return
        with self._lock:
            self._known[sid] = known
            self._known.move_to_end(sid)
            while len(self._known) > self.capacity:
                self._known.popitem(last=False)

    def forget(self, sid: str) -> None:
        with self._lock:
            self._known.pop(sid, None)

    def __len__(self) -> int:
        return len(self._known)
