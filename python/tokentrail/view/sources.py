"""Where the viewer's sessions come from: a journal on disk (`tokentrail view PATH`), read again
when it changes, or the sessions a running adapter holds (its `/tokentrail/ui`).

Both hand the page the same JSON (`view.view_model`); a source is a `SessionSource`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tokentrail.errors import NotFound, TokentrailError
from tokentrail.storage.journal.read import read_journal
from tokentrail.storage.replay import Settings, record_session
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer
from tokentrail.trajectory.linearize import Trajectory
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.restore import EchoRestorer
from tokentrail.trajectory.tree import Node
from tokentrail.view.view_model import (
    Decode,
    SessionData,
    session_detail,
    session_summary,
    turn_detail,
)

if TYPE_CHECKING:
    from tokentrail import _core

logger = logging.getLogger(__name__)

__all__ = ["JournalSource", "LiveSource", "SessionSource", "token_text"]


class SessionSource(Protocol):
    """What the viewer's JSON API reads."""

    def describe(self) -> dict[str, Any]: ...
    def summaries(self) -> list[dict[str, Any]]: ...
    def detail(self, sid: str) -> dict[str, Any]: ...
    def turn(self, sid: str, turn_index: int) -> dict[str, Any]: ...


def token_text(tokenizer: LoadedTokenizer) -> Decode:
    """Each id's text on its own (special tokens as their text), remembered per id."""
    cache: dict[int, str] = {}

    def decode(ids: Sequence[int]) -> list[str]:
        out = []
        for i in ids:
            text = cache.get(i)
            if text is None:
                text = cache[i] = tokenizer.decode([i])
            out.append(text)
        return out

    return decode


def _no_turn(sid: str, turn_index: int) -> NotFound:
    return NotFound(f"session {sid!r} has no generated turn {turn_index}")


class JournalSource:
    """A journal's sessions, linearized as recorded; read again when its files change (a
    journal a running adapter writes is watched live)."""

    def __init__(self, path: str | Path, tokenizer: LoadedTokenizer | None = None) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._signature: tuple[float, ...] | None = None
        self._sessions: dict[str, tuple[tuple[str, int], SessionData]] = {}
        self._meta: dict[str, str] = {}
        self._tokenizer = tokenizer
        self._decode: Decode | None = token_text(tokenizer) if tokenizer else None
        self._replay_names: Sequence[str] = ()
        self.refresh()

    def _files_signature(self) -> tuple[float, ...]:
        out = []
        for suffix in ("", "-wal"):
            try:
                st = os.stat(f"{self.path}{suffix}")
                out += [st.st_mtime, float(st.st_size)]
            except FileNotFoundError:
                out += [0.0, 0.0]
        return tuple(out)

    def refresh(self) -> None:
        """Read the journal again if its files changed; sessions whose events did not change
        keep their linearization."""
        with self._lock:
            signature = self._files_signature()
            if signature == self._signature:
                return
            contents = read_journal(self.path)
            self._meta = dict(contents.meta)
            if self._tokenizer is None and self._meta.get("tokenizer"):
                self._load_tokenizer(self._meta["tokenizer"])
            pipeline = Settings.recorded(contents.meta).pipeline(None)
            manager = pipeline.manager
            self._replay_names = manager.core.REPLAY_STATUS
            sessions: dict[str, tuple[tuple[str, int], SessionData]] = {}
            for record in contents.records():
                key = (record.state, record.events)
                kept = self._sessions.get(record.sid)
                if kept is not None and kept[0] == key:
                    sessions[record.sid] = kept
                    continue
                record_session(record, pipeline)
                data = _inspect(manager, record.sid, record.state)
                # What the journal lost of the session counts in its ledger, as in `as_recorded`.
                data.trajectory.mark_lost(record.losses())
                sessions[record.sid] = (key, data)
                manager.drop_session(record.sid)
                pipeline.forget(record.sid)
            self._sessions = sessions
            self._signature = signature

    def _load_tokenizer(self, name: str) -> None:
        try:
            self._tokenizer = load_tokenizer(name)
        except (TokentrailError, OSError) as exc:
            logger.warning("%s: tokenizer %s not loaded (%s): ids only", self.path, name, exc)
            return
        self._decode = token_text(self._tokenizer)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "journal",
            "path": str(self.path),
            "tokenizer": self._meta.get("tokenizer"),
            "text": self._decode is not None,
        }

    def _get(self, sid: str) -> SessionData:
        self.refresh()
        found = self._sessions.get(sid)
        if found is None:
            raise NotFound(f"no session {sid!r} in {self.path}")
        return found[1]

    def summaries(self) -> list[dict[str, Any]]:
        self.refresh()
        return [session_summary(data) for _key, data in self._sessions.values()]

    def detail(self, sid: str) -> dict[str, Any]:
        return session_detail(self._get(sid))

    def turn(self, sid: str, turn_index: int) -> dict[str, Any]:
        found = turn_detail(self._get(sid), turn_index, self._decode, self._replay_names)
        if found is None:
            raise _no_turn(sid, turn_index)
        return found


def _inspect(manager: TrajectoryManager, sid: str, state: str) -> SessionData:
    def read(
        root: Node, store: _core.TurnStore, trajectory: Trajectory, echoes: EchoRestorer
    ) -> SessionData:
        return SessionData(sid, state, root, store, trajectory, echoes)

    return manager.inspect(sid, read)


class LiveSource:
    """The sessions a running adapter's manager holds, linearized as they stand at each read
    (under the manager's lock); a finished session leaves it for the journal."""

    def __init__(self, manager: TrajectoryManager, tokenizer: LoadedTokenizer | None) -> None:
        self.manager = manager
        self._tokenizer_name = tokenizer.name if tokenizer else None
        self._decode = token_text(tokenizer) if tokenizer else None
        # Per session, its summary at a turn count: a poll of the list linearizes (under the
        # manager's lock, which turns wait on) only the sessions that got a turn since.
        self._summaries: dict[str, tuple[int, dict[str, Any]]] = {}

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "live",
            "path": None,
            "tokenizer": self._tokenizer_name,
            "text": self._decode is not None,
        }

    def _read(self, sid: str, what: Any) -> Any:
        def read(
            root: Node, store: _core.TurnStore, trajectory: Trajectory, echoes: EchoRestorer
        ) -> Any:
            return what(SessionData(sid, "live", root, store, trajectory, echoes))

        try:
            return self.manager.inspect(sid, read)
        except TokentrailError as exc:
            if not self.manager.has_session(sid):
                raise NotFound(f"no live session {sid!r}") from exc
            raise

    def summaries(self) -> list[dict[str, Any]]:
        out, kept = [], {}
        for sid in self.manager.sessions():
            turns = self.manager.turn_count(sid)
            cached = self._summaries.get(sid)
            if cached is not None and cached[0] == turns:
                summary = cached[1]
            else:
                try:
                    summary = self._read(sid, session_summary)
                except NotFound:
                    continue  # finished while we looked
            kept[sid] = (turns, summary)
            out.append(summary)
        self._summaries = kept
        return out

    def detail(self, sid: str) -> dict[str, Any]:
        return dict(self._read(sid, session_detail))

    def turn(self, sid: str, turn_index: int) -> dict[str, Any]:
        names = self.manager.core.REPLAY_STATUS
        found = self._read(sid, lambda data: turn_detail(data, turn_index, self._decode, names))
        if found is None:
            raise _no_turn(sid, turn_index)
        return dict(found)
