"""A loopback TCP proxy that records what a server wrote, read by read, for tests that must see
when bytes reached the client (a streamed reply going out as sampled, not all at the end).

`tapped(upstream_port)` runs the proxy in a thread and yields a `Tap`: its `url`, and for each
connection the server's bytes as the proxy read them, in order (`reads`). A server that flushes
a frame and then waits is read apart from what it writes next.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Tap:
    url: str = ""
    # Per connection, the server's bytes as read (one entry per read).
    reads: list[list[bytes]] = field(default_factory=list)

    def events(self) -> list[list[tuple[int, str]]]:
        """Per connection, each SSE `event:` name with the index of the read it arrived in."""
        out = []
        for reads in self.reads:
            data = b"".join(reads)
            ends = []
            total = 0
            for chunk in reads:
                total += len(chunk)
                ends.append(total)
            named = []
            for match in re.finditer(rb"event: ([a-z_.]+)\n", data):
                read = next(i for i, end in enumerate(ends) if end > match.start())
                named.append((read, match.group(1).decode()))
            out.append(named)
        return out


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, log: list[bytes] | None
) -> None:
    try:
        while chunk := await reader.read(1 << 16):
            if log is not None:
                log.append(chunk)
            writer.write(chunk)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@contextmanager
def tapped(upstream: str) -> Iterator[Tap]:
    """A proxy to `upstream` (`http://127.0.0.1:PORT`), recording the server's side."""
    host, port = upstream.rsplit("//", 1)[1].split(":")
    tap = Tap()
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    async def client(down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(host, int(port))
        log: list[bytes] = []
        tap.reads.append(log)
        await asyncio.gather(_pipe(down_r, up_w, None), _pipe(up_r, down_w, log))

    async def start() -> asyncio.base_events.Server:
        server = await asyncio.start_server(client, "127.0.0.1", 0)
        tap.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return server

    def run() -> None:
        asyncio.set_event_loop(loop)
        started["server"] = loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    started: dict[str, asyncio.base_events.Server] = {}
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield tap
    finally:
        started["server"].close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
