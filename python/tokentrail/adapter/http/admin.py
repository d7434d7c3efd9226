"""The admin routes: finish a session (its samples and ledger come back), drop one, and list
the sessions recovered from the journal with turns lost.

They hand out what harnesses wrote and end other people's sessions, so they are closed unless
the operator sets an admin token (`--admin-token`, or `TOKENTRAIL_ADMIN_TOKEN`): without one
they answer 403 over HTTP, and the in-process API (`Adapter.finish_session`, ...) is the way
in. With one, a request must carry it as `Authorization: Bearer TOKEN`; the comparison takes
the same time whatever the guess.

A finish of a session that lost journaled turns is a 409 `session_damaged` stating the loss
(and the ledger of what is left), unless the body says `"accept_lost": true`: then a 200 with
the samples and the same loss in `lost`, in the ledger and in every sample's metadata.

`/finish` answers JSON unless `Accept` asks for `application/x-npz` or
`application/vnd.apache.arrow.stream`: then the samples come as typed arrays, streamed
(`storage.finish_wire`, which `read_finish` reads back).
"""

from __future__ import annotations

import asyncio
import hmac
import io
import json
from typing import Any

from aiohttp import web

from tokentrail.adapter.http.middleware import error_response
from tokentrail.adapter.offload import Offload, trim_memory
from tokentrail.adapter.protocols.ids import bearer
from tokentrail.adapter.request.limits import Limits
from tokentrail.adapter.request.parse import parse_body
from tokentrail.adapter.request.read import read_body
from tokentrail.adapter.session.damaged import refuse_unless_accepted
from tokentrail.adapter.session.sessions import Sessions
from tokentrail.errors import (
    AuthenticationError,
    PermissionDenied,
    RequestError,
    SessionDamaged,
    SessionError,
)
from tokentrail.storage.finish_wire import FinishFormat, pick_format, write_finish
from tokentrail.trajectory.manager import Trajectory

__all__ = ["Admin", "finish_payload"]

FINISH_PATH = "/tokentrail/sessions/{sid}/finish"
DROP_PATH = "/tokentrail/sessions/{sid}"
DAMAGED_PATH = "/tokentrail/damaged"


class Admin:
    """Finish and drop over HTTP, behind the admin token."""

    def __init__(
        self, token: str | None, sessions: Sessions, offload: Offload, limits: Limits
    ) -> None:
        self.token = token or None
        self.sessions = sessions
        self.offload = offload
        self.limits = limits

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(FINISH_PATH, self.finish),
            web.delete(DROP_PATH, self.drop),
            web.get(DAMAGED_PATH, self.damaged),
        ]

    def check(self, request: web.Request) -> None:
        if self.token is None:
            raise PermissionDenied(
                "admin routes are off: start the server with --admin-token (or set "
                "TOKENTRAIL_ADMIN_TOKEN), or finish sessions through the in-process API"
            )
        given = bearer(request.headers) or ""
        if not hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode()):
            raise AuthenticationError("admin token required (Authorization: Bearer TOKEN)")

    async def finish(self, request: web.Request) -> web.StreamResponse:
        self.check(request)
        raw = await read_body(
            request, max_bytes=self.limits.max_body_bytes, timeout_s=self.limits.body_timeout_s
        )
        body: dict[str, Any] = {}
        if raw.strip():
            body = await self.offload.run(parse_body, raw, self.limits.max_json_depth)
        reward = body.get("reward", 0.0)
        metadata = body.get("metadata") or {}
        accept_lost = body.get("accept_lost", False)
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise RequestError("reward must be a number")
        if not isinstance(metadata, dict):
            raise RequestError("metadata must be an object")
        if not isinstance(accept_lost, bool):
            raise RequestError("accept_lost must be a boolean")
        sid = request.match_info["sid"]
        try:
            trajectory = await self.sessions.finish(sid, reward=float(reward), metadata=metadata)
            refuse_unless_accepted(sid, trajectory, accept_lost)
        except SessionDamaged as exc:
            return damaged_response(request.path, exc)
        fmt = pick_format(request.headers.get("Accept"))
        if fmt is not FinishFormat.JSON:
            return await self._binary(request, fmt, trajectory)
        payload = await self.offload.run(finish_payload, trajectory)
        del trajectory
        # What building the answer took (a sample's images are their base64 again) goes back.
        await self.offload.run(trim_memory, 0.0)
        return web.Response(body=payload, content_type="application/json")

    async def _binary(
        self, request: web.Request, fmt: FinishFormat, trajectory: Trajectory
    ) -> web.StreamResponse:
        """The samples as typed arrays (`storage.finish_wire`), streamed as they are written:
        the writer runs in a thread and hands each piece to the loop, waiting until it is sent."""
        response = web.StreamResponse(headers={"Content-Type": str(fmt)})
        await response.prepare(request)
        loop = asyncio.get_running_loop()

        class Sink(io.RawIOBase):
            def writable(self) -> bool:
                return True

            def write(self, data: Any) -> int:
                piece = bytes(data)
                asyncio.run_coroutine_threadsafe(response.write(piece), loop).result()
                return len(piece)

        samples, ledger, lost = trajectory.samples, trajectory.ledger.to_dict(), trajectory.lost
        await asyncio.to_thread(write_finish, Sink(), fmt, samples, ledger, lost)
        await response.write_eof()
        return response

    async def damaged(self, request: web.Request) -> web.StreamResponse:
        """The sessions recovered with journaled turns lost since this start, and what each
        lost (the journal's whole history: `tokentrail journal check`)."""
        self.check(request)
        sessions = self.sessions
        listing = sessions.lost.listing(lambda sid: "open" if sessions.get(sid) else "closed")
        return web.json_response({"sessions": listing})

    async def drop(self, request: web.Request) -> web.StreamResponse:
        self.check(request)
        sid = request.match_info["sid"]
        if not await self.sessions.drop_soon(sid):
            raise SessionError(f"unknown session {sid!r}")
        return web.json_response({"dropped": sid})


def finish_payload(trajectory: Trajectory) -> bytes:
    """The JSON `/finish` answers: every sample, the ledger, and what the session lost before
    it was linearized (null: nothing)."""
    return json.dumps(
        {
            "samples": [s.to_dict() for s in trajectory.samples],
            "ledger": trajectory.ledger.to_dict(),
            "lost": trajectory.lost,
        },
        ensure_ascii=False,
    ).encode()


def damaged_response(path: str, exc: SessionDamaged) -> web.Response:
    """The 409 of a damaged session's finish: the error, what was lost, the ledger of the rest."""
    response = error_response(path, exc.status, exc.kind, str(exc))
    body = json.loads(response.body)  # type: ignore[arg-type]
    body.update(session=exc.sid, lost=exc.lost, ledger=exc.ledger)
    return web.json_response(body, status=exc.status)
