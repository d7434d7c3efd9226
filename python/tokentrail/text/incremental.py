"""Incremental tokenization: a session's next prompt is encoded from the last added token (such
as `<|im_start|>`) it shares with the previous one, reusing the ids before it; the result always
equals a full encode.

`IncrementalEncoder` runs the backend's `IncrementalTokenizer`: the Rust core's encodes with its
own fast byte-level BPE encoder where it can prove that gives `tokenizers`' ids (`fast_path`),
and with `tokenizers` elsewhere; the Python reference's (`backend="python"`) always with
`tokenizers`, for differential tests.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tokentrail.core.backend import Core, load_backend
from tokentrail.kinds import Backend
from tokentrail.text.tokenizer import LoadedTokenizer, TokenizerError

if TYPE_CHECKING:
    from tokentrail import _core

logger = logging.getLogger(__name__)

__all__ = ["IncrementalEncoder"]


# One loaded core tokenizer per `LoadedTokenizer` and backend: every encoder forks it, sharing
# the vocabulary (loading 150K tokens takes about half a second) but keeping its own sessions.
_PROTOTYPES: weakref.WeakKeyDictionary[LoadedTokenizer, dict[Core, _core.IncrementalTokenizer]] = (
    weakref.WeakKeyDictionary()
)


class IncrementalEncoder:
    """Per-session incremental encoding of `loaded`'s prompts, by the backend's core (`backend`
    as `load_backend` reads it: default `TOKENTRAIL_BACKEND`, else the Rust core).

    Logs one warning, when built, if the tokenizer's boundaries cannot be proven safe; it then
    encodes every prompt in full.
    """

    def __init__(self, loaded: LoadedTokenizer, backend: Backend | str | None = None) -> None:
        if loaded.tokenizer.encode_special_tokens:
            # tokenizer.json does not carry this switch, so the core would split special tokens.
            raise TokenizerError(f"{loaded.name}: encode_special_tokens is not supported")
        self.name = loaded.name
        core = load_backend(backend)
        prototypes = _PROTOTYPES.setdefault(loaded, {})
        prototype = prototypes.get(core)
        if prototype is None:
            prototype = prototypes[core] = core.IncrementalTokenizer(loaded.tokenizer.to_str())
        self._core = prototype.fork()
        if self._core.fallback_reason is not None:
            logger.warning(
                "incremental tokenization disabled for %s: %s; every prompt is encoded in full",
                self.name,
                self._core.fallback_reason,
            )
        if self._core.fast_path_reason is not None:
            # Only slower, never different: not something a trainer must act on.
            logger.debug(
                "%s is encoded through tokenizers: %s", self.name, self._core.fast_path_reason
            )

    @property
    def safe(self) -> bool:
        """Whether prompts are resumed after added tokens."""
        return self._core.safe

    @property
    def fallback_reason(self) -> str | None:
        """Why they are not, when they are not."""
        return self._core.fallback_reason

    @property
    def fast_path(self) -> bool:
        """Whether text is encoded by the core's fast encoder rather than by `tokenizers`
        (the ids are the same either way)."""
        return self._core.fast_path

    @property
    def fast_path_reason(self) -> str | None:
        """Why it is encoded by `tokenizers`, when it is."""
        return self._core.fast_path_reason

    def encode(self, session: str, text: str) -> npt.NDArray[np.uint32]:
        """Ids of `text` (as `loaded.encode(text)`), reusing `session`'s previous prompt."""
        return self._core.encode(session, text)

    def encode_full(self, text: str) -> npt.NDArray[np.uint32]:
        """Ids of `text`, encoded in full; no session is read or kept."""
        return self._core.encode_full(text)

    def forget(self, session: str) -> None:
        """Drop what is kept for `session` (nothing happens if there is none)."""
        self._core.forget(session)

    def sessions(self) -> int:
        """How many sessions have a prompt kept."""
        return self._core.sessions()

    def reused_ids(self) -> int:
        """Ids taken from kept prompts instead of being encoded, over all `encode` calls."""
        return self._core.reused_ids()

    def encoded_bytes(self) -> int:
        """UTF-8 bytes of text actually encoded, over all `encode` calls."""
        return self._core.encoded_bytes()
