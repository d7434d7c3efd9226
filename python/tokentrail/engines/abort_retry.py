"""A turn the engine aborted on its own, generated again.

vLLM's `/pause?mode=abort` (a weight push, `integrations.weights`) stops every request it is
sampling: each is answered (200) with finish `abort` and the tokens sampled so far; a stream's
last chunk says `abort` and holds no tokens. `AbortRetry` waits until the engine serves again
(`GET /is_paused` answers false; a server without that route is taken as serving) and asks
again, at most `retries` times. The harness gets the last attempt's answer, never the abort;
the aborted attempts travel with it (`Generation.discarded`: recorded, never trained). A turn
the harness gave up on (`Engine.abort`: its client went away) stays an abort, and so does one
whose tokens already went out to a live stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tokentrail.core.discarded import Discarded
from tokentrail.engines.base import Generation
from tokentrail.errors import EngineError
from tokentrail.kinds import FinishReason

logger = logging.getLogger(__name__)

# How often one turn is generated again after the engine aborted it.
ABORT_RETRIES = 3
IS_PAUSED_PATH = "/is_paused"
# How often `/is_paused` is asked while the engine is paused (a weight reload takes seconds).
RESUME_POLL_S = 0.05

Attempt = Callable[[], Awaitable[Generation]]


class AbortRetry:
    """The retries of one engine client: `run` generates a turn, again after each abort the
    engine made on its own; `stop` marks a turn its harness gave up on, which is not retried
    (and whose wait for the engine ends). `ask(path)` is a GET of the engine's JSON."""

    def __init__(
        self,
        ask: Callable[[str], Awaitable[Any]],
        *,
        retries: int = ABORT_RETRIES,
        timeout_s: float = 600.0,
    ) -> None:
        self.ask = ask
        self.retries = retries
        self.timeout_s = timeout_s
        self._stops: dict[str, asyncio.Event] = {}

    def stop(self, request_id: str) -> None:
        """The harness gave up on turn `request_id`: what the engine answers is its answer."""
        stopped = self._stops.get(request_id)
        if stopped is not None:
            stopped.set()

    async def run(
        self,
        request_id: str,
        attempt: Attempt,
        may_retry: Callable[[], bool] | None = None,
    ) -> Generation:
        """`attempt()`'s generation; while it ends `abort` and the harness did not stop it (and
        `may_retry()` holds: nothing of it went out yet), once the engine serves again it is
        generated again, up to `retries` times. The aborted attempts come back as the answer's
        `discarded`."""
        stopped = self._stops.setdefault(request_id, asyncio.Event())
        discarded: list[Discarded] = []
        try:
            while True:
                generation = await attempt()
                if (
                    generation.finish_reason != FinishReason.ABORT
                    or stopped.is_set()
                    or (may_retry is not None and not may_retry())
                ):
                    break
                if len(discarded) >= self.retries:
                    logger.warning(
                        "request %s: the engine aborted it %d times; answered as aborted",
                        request_id,
                        len(discarded) + 1,
                    )
                    break
                logger.info(
                    "request %s: the engine aborted it after %d tokens; generating it again",
                    request_id,
                    len(generation.output_ids),
                )
                if not await self._serving(stopped):
                    break
                discarded.append(
                    Discarded.of(
                        generation.output_ids, generation.logprobs, generation.weight_versions
                    )
                )
        finally:
            self._stops.pop(request_id, None)
        if not discarded:
            return generation
        return dataclasses.replace(generation, discarded=(*discarded, *generation.discarded))

    async def _serving(self, stopped: asyncio.Event) -> bool:
        """Wait until the engine serves again: True then, False when the harness stopped the
        turn meanwhile. Raises `EngineError` when it stays paused past `timeout_s`."""
        deadline = time.monotonic() + self.timeout_s
        while not stopped.is_set():
            try:
                answer = await self.ask(IS_PAUSED_PATH)
            except EngineError as exc:
                if exc.engine_status == 404:
                    return True  # no pause routes: whatever aborted it, the engine serves
                answer = None  # not answering (restarting): ask again
            if isinstance(answer, dict) and answer.get("is_paused") is False:
                return True
            if time.monotonic() > deadline:
                raise EngineError(
                    f"the engine aborted a turn and stayed paused for {self.timeout_s:.0f} s"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), RESUME_POLL_S)
        return False
