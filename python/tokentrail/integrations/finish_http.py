"""Finishing a session over HTTP from a trainer (a Ray task, a rollout worker talking to a
`tokentrail serve` of its own): `/finish` asked for typed arrays (npz by default) and read back
as samples, the ledger and the loss (`storage.finish_wire`).

An in-process adapter needs none of this (`Adapter.finish_trajectory` returns the samples), nor
does the Ray pool (`tokentrail.scale` ships samples as numpy columns through Ray's object store).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from tokentrail.storage.finish_wire import FinishAnswer, FinishFormat, read_finish

__all__ = ["finish_over_http"]


def finish_over_http(
    url: str,
    sid: str,
    *,
    admin_token: str,
    reward: float = 0.0,
    metadata: dict[str, Any] | None = None,
    accept_lost: bool = False,
    fmt: FinishFormat = FinishFormat.NPZ,
    timeout_s: float = 600.0,
) -> FinishAnswer:
    """Finish `sid` on the adapter at `url` (its base URL) and read its answer in `fmt`.
    Raises `urllib.error.HTTPError` for a refusal (its body is the JSON error)."""
    body = {"reward": reward, "metadata": metadata or {}, "accept_lost": accept_lost}
    req = urllib.request.Request(
        f"{url.rstrip('/')}/tokentrail/sessions/{sid}/finish",
        json.dumps(body).encode(),
        {
            "Authorization": f"Bearer {admin_token}",
            "Content-Type": "application/json",
            "Accept": str(fmt),
        },
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return read_finish(resp.read(), resp.headers["Content-Type"])
