"""The HTTP adapter a harness talks to, as if it were the Anthropic or OpenAI API.

Its folders are a request's way through it, and a request goes through each once, in order:

- `http/`: the aiohttp server (`server.py`) accepts the request on a guarded connection
  (`connections.py`), admits it within the memory budget (`memory.py`), picks the protocol its
  route belongs to, and answers every error in that protocol's JSON shape (`middleware.py`);
  what it learns of the request (`notes.py`) goes into the access log (`access_log.py`). The
  admin routes (`admin.py`) finish and drop sessions.
- `request/`: the body, one step per module: its bytes read (`read.py`), parsed to a JSON object
  (`parse.py`, reusing what it shares with the session's previous request, kept in `memo.py`),
  its shape held to the limits (`limits.py`), translated to a conversation and checked
  (`translate.py`), its sampling held to the limits. The server reads the bytes; `reader.py`
  runs the other steps in that order and hands a `TurnRequest` on. `context.py` says how long
  a prompt may be.
- `turn/`: the turn around one engine call (`turns.py`), within the caps on turns and engine
  calls at once (`slots.py`): a retry answered from the record (`answers.py`), the reply streamed
  as it is sampled (`live.py`) or written whole (`whole_reply.py`).
- `session/`: the sessions the turns are recorded in (`sessions.py`): opened, finished, evicted,
  recovered from the journal with what they lost (`damaged.py`), their kept finishes' images
  out of the heap (`spill.py`).

Beside them: `protocols/` (one module per wire protocol), `config.py` (the adapter's settings),
`metrics.py` (its Prometheus metrics) and `offload.py` (the worker pool every CPU-heavy step of
each folder runs in).

`Adapter`, `AdapterConfig`, `SessionSettings`, `Limits`, `start_server` and `serve_forever` are
importable from here; each is imported when first asked for, so `tokentrail.adapter.config`
alone does not load the server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokentrail.adapter.config import AdapterConfig, SessionSettings
    from tokentrail.adapter.http.server import Adapter, serve_forever, start_server
    from tokentrail.adapter.request.limits import Limits

__all__ = [
    "Adapter",
    "AdapterConfig",
    "Limits",
    "SessionSettings",
    "serve_forever",
    "start_server",
]

_HOMES = {
    "Adapter": "tokentrail.adapter.http.server",
    "AdapterConfig": "tokentrail.adapter.config",
    "Limits": "tokentrail.adapter.request.limits",
    "SessionSettings": "tokentrail.adapter.config",
    "serve_forever": "tokentrail.adapter.http.server",
    "start_server": "tokentrail.adapter.http.server",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
