"""The context a request may fill: what the engine serves where it says (vLLM's
`max_model_len`), else the model's from its config. A prompt over it is the protocol's 400, not
the engine's refusal passed on as a 502."""

from __future__ import annotations

import logging

from tokentrail.engines.base import Engine, ServedContext
from tokentrail.errors import EngineError

logger = logging.getLogger(__name__)

__all__ = ["ContextLength"]


class ContextLength:
    """`tokens()`: the engine's served context, asked once (again after a failed ask), else
    `configured` (the model's from its config; 0: unknown)."""

    def __init__(self, engine: Engine, configured: int) -> None:
        self.engine = engine
        self.configured = configured
        self._served: int | None = None  # 0: the engine says none

    async def tokens(self) -> int:
        if self._served is None:
            served = 0
            if isinstance(self.engine, ServedContext):
                try:
                    served = await self.engine.served_context()
                except EngineError as exc:  # asked again next turn
                    logger.debug("the engine's served context is unknown for now: %s", exc)
                    return self.configured
            if served:
                logger.info("the engine serves a context of %d tokens", served)
            self._served = served
        return self._served or self.configured
