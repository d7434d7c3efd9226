"""Every request a real harness sends to an adapter, as the adapter read it, for the corpus of
harness request bodies in `tests/fixtures/requests/` (`test_harness_corpus.py` runs the field
check and the translation over every body in it).

`capture(adapter)` adds an outermost middleware to the adapter's app (before it serves) and
returns the list it appends to: each request's method, path, status and JSON body. `redacted`
shortens the texts a harness wrote (prompts, tool descriptions) to their length, keeping every
field, type and structure: what the field check reads is kept as sent. A recording that must
prove a side-request rule keeps the texts the rule reads whole (`keep`: a string holding one of
these markers is not shortened).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from tokentrail.adapter import Adapter, AdapterConfig
from tokentrail.adapter.http.access_log import AccessLog
from tokentrail.engines.base import Engine
from tokentrail.text.tokenizer import LoadedTokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "requests"
# Strings longer than this are a harness's prose; shorter ones are names, ids and settings.
KEEP_CHARS = 160


@dataclass
class Captured:
    method: str
    path: str
    status: int
    body: Any


def harness_adapter(engine: Engine, tokenizer: LoadedTokenizer, log: Path) -> Adapter:
    """The adapter a real harness's default configuration runs against: resumed requests
    checked against a full translation, known side requests excluded, a JSON access log at
    `log` (where a test looks for 4xx)."""
    return Adapter(
        engine=engine,
        tokenizer=tokenizer,
        config=AdapterConfig(
            verify_resume=True,
            exclude_known_side_requests=True,
            access_log=AccessLog(str(log), json=True),
        ),
    )


def capture(adapter: Adapter) -> list[Captured]:
    seen: list[Captured] = []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        raw = await request.read() if request.can_read_body else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            seen.append(Captured(request.method, request.path, status, body))

    adapter.app.middlewares.insert(0, record)
    return seen


def redacted(value: Any, keep: tuple[str, ...] = ()) -> Any:
    """`value` with every long string replaced by a marker of its length (structure kept), but
    for the strings that hold one of the `keep` markers."""
    if isinstance(value, str) and len(value) > KEEP_CHARS:
        return value if any(k in value for k in keep) else f"[{len(value)} chars]"
    if isinstance(value, list):
        return [redacted(v, keep) for v in value]
    if isinstance(value, dict):
        return {k: redacted(v, keep) for k, v in value.items()}
    return value


def _anonymous(body: dict[str, Any]) -> dict[str, Any]:
    """The body without what names the machine it ran on (Claude Code's `metadata.user_id`
    holds a device id): the string's place and type kept."""
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        return {**body, "metadata": {**metadata, "user_id": "[device and session ids]"}}
    return body


def write_corpus(
    name: str,
    harness: str,
    version: str,
    configuration: str,
    requests: list[Captured],
    keep: tuple[str, ...] = (),
) -> Path:
    """Write the POSTed JSON bodies of one run as `tests/fixtures/requests/<name>.json`; the
    strings holding one of the `keep` markers are written whole."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    path = FIXTURES / f"{name}.json"
    bodies = [
        {"path": c.path, "status": c.status, "body": _anonymous(redacted(c.body, keep))}
        for c in requests
        if c.method == "POST" and isinstance(c.body, dict)
    ]
    note = (
        "Every JSON body the real harness POSTed in one run, as the adapter read it; strings "
        "over 160 characters (prompts, descriptions) are replaced by their length"
    )
    if keep:
        note += f", but for those holding one of {list(keep)}, kept whole"
    doc = {
        "harness": harness,
        "version": version,
        "configuration": configuration,
        "note": note + ". `status` is what the adapter answered.",
        "requests": bodies,
    }
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", "utf-8")
    return path
