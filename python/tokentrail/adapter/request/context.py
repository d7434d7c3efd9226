"""The context a request may fill: what the engine serves where it says (vLLM's
`max_model_len`), else the model's from its config. A prompt over it is the protocol's 400, not
the engine's refusal passed on as a 502."""

from __future__ import annotations

import json
import logging

from tokentrail.engines.base import Engine, ServedContext
from tokentrail.errors import EngineError
from tokentrail.text.tokenizer import LoadedTokenizer

logger = logging.getLogger(__name__)

__all__ = ["ContextLength", "model_context_length"]


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


def model_context_length(tokenizer: LoadedTokenizer) -> int:
    """The context length the model directory's `config.json` names, or 0."""
    if tokenizer.path is None:
        return 0
    config_file = tokenizer.path.parent / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return 0
    for section in (config, config.get("text_config") or {}):
        if not isinstance(section, dict):
            continue
        for key in ("max_position_embeddings", "max_sequence_length", "seq_length"):
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0
