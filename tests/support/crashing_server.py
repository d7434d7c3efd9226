"""`tokentrail serve` that SIGKILLs itself at a chosen point of a chosen turn.

    python tests/support/crashing_server.py POINT TURN -- serve --journal run.db ...

Runs the real `tokentrail serve` (the CLI's own entry point) after wrapping a few functions so
that the process kills itself with SIGKILL, exactly as an outside `kill -9` would, at one point
of its TURN-th generated turn (counted from 1 in this process):

- `journal`: before the turn's journal commit;
- `journaled`: right after it;
- `recorded`: after the turn is recorded in memory, before any byte of the reply is written;
- `headers`: after the reply's headers went out;
- `write-K`: after the K-th write of the reply's body (a reply streamed as sampled writes
  as its frames go out; a reply written whole, SSE or JSON, writes once, before its end);
- `flushed`: after the whole reply was written and flushed.

Used by `benches/kill_sweep.py` and `tests/test_exactly_once.py`.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

POINTS = ("journal", "journaled", "recorded", "headers", "flushed")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install(point: str, turn: int) -> None:
    from aiohttp import web

    from tokentrail.adapter.turn.answers import Answers, RecordedAnswer
    from tokentrail.storage.journal import Journal

    state = {"turns": 0, "writes": 0, "armed": False}
    write_k = int(point.split("-", 1)[1]) if point.startswith("write-") else None

    original_turn = Journal.turn

    def turn_hook(self: Journal, *args: Any, **kwargs: Any) -> int:
        state["turns"] += 1
        here = state["turns"] == turn
        if here and point == "journal":
            _die()
        seq = original_turn(self, *args, **kwargs)
        if here and point == "journaled":
            _die()
        return seq

    original_remember = Answers.remember

    def remember_hook(self: Answers, answer: RecordedAnswer) -> None:
        original_remember(self, answer)
        if state["turns"] == turn:
            if point == "recorded":
                _die()
            state["armed"] = True

    original_prepare = web.StreamResponse.prepare
    original_write = web.StreamResponse.write
    original_eof = web.StreamResponse.write_eof

    async def prepare_hook(self: web.StreamResponse, request: web.BaseRequest) -> Any:
        out = await original_prepare(self, request)
        if state["armed"] and point == "headers":
            _flush_and_die(self)
        return out

    async def write_hook(self: web.StreamResponse, data: Any) -> None:
        await original_write(self, data)
        if state["armed"] and write_k is not None:
            state["writes"] += 1
            if state["writes"] == write_k:
                _flush_and_die(self)

    async def eof_hook(self: web.StreamResponse, data: bytes = b"") -> None:
        await original_eof(self, data)
        if state["armed"]:
            if point == "flushed":
                _flush_and_die(self)
            state["armed"] = False

    Journal.turn = turn_hook  # type: ignore[method-assign]
    Answers.remember = remember_hook  # type: ignore[method-assign]
    web.StreamResponse.prepare = prepare_hook  # type: ignore[method-assign]
    web.StreamResponse.write = write_hook  # type: ignore[method-assign]
    web.StreamResponse.write_eof = eof_hook  # type: ignore[method-assign]


def _flush_and_die(response: Any) -> None:
    """Die once what was written has left the process (the kernel then still delivers it)."""
    transport = getattr(getattr(response, "_req", None), "transport", None)
    if transport is not None:
        # What aiohttp handed the transport but the socket did not take yet is lost with the
        # process, as in a real crash; push it to the socket first so that the point is where
        # the client can see it.
        while transport.get_write_buffer_size():
            try:
                transport._write_ready()  # noqa: SLF001 - asyncio's selector transport
            except Exception:  # noqa: BLE001 - the peer may have gone
                break
    _die()


def main(argv: list[str]) -> int:
    point, turn, sep, *serve = argv
    if sep != "--":
        raise SystemExit(__doc__)
    if point not in POINTS and not point.startswith("write-"):
        raise SystemExit(f"unknown point {point!r}")
    install(point, int(turn))
    from tokentrail.cli import main as cli_main

    return cli_main(serve)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
