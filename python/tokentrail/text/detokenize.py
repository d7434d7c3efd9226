"""The text of token ids: by the Rust core's table of every id's bytes where the tokenizer's
decoder is `ByteLevel` (`_core.Detokenizer`: exactly `tokenizers`' text, and many times
faster, with no hash lookup or string per token), else by `tokenizers`.

`tokenizers` holds the interpreter through `decode` (47 ms for a 109K-token turn, the event
loop waiting for it) and lets go of it in `decode_batch`, so a long run it decodes goes as a
batch of one; the core lets go of it past 16K ids. With `TOKENTRAIL_VERIFY_DECODE` set (the
test suite sets it, for every turn it sends), each text the core gives is checked against
`tokenizers`'.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from tokentrail.core.backend import load_backend
from tokentrail.errors import TokenizerError

if TYPE_CHECKING:
    from tokentrail._core import Detokenizer

logger = logging.getLogger(__name__)

__all__ = ["DECODE_INLINE_TOKENS", "VERIFY_DECODE_ENV", "byte_level", "decode", "decode_slow"]

VERIFY_DECODE_ENV = "TOKENTRAIL_VERIFY_DECODE"
VERIFY_DECODE = os.environ.get(VERIFY_DECODE_ENV, "") not in ("", "0")

# Up to this many ids `tokenizers`' `decode` holds the interpreter well under a millisecond.
DECODE_INLINE_TOKENS = 2048


def decode(table: Detokenizer | None, tokenizer: Tokenizer, name: str, ids: Sequence[int]) -> str:
    """The text of `ids`, special tokens kept as their text: by `table` (`byte_level`'s, for
    `tokenizer`, named `name`) where there is one."""
    if table is None:
        return decode_slow(tokenizer, ids)
    text = table.decode(ids if isinstance(ids, list | tuple) else list(ids))
    if VERIFY_DECODE and text != decode_slow(tokenizer, ids):
        raise TokenizerError(
            f"{name}: the core's text of {len(ids)} ids is not tokenizers' "
            f"({VERIFY_DECODE_ENV} is set)"
        )
    return text


def decode_slow(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
    """`tokenizers`' text of `ids`, a long run as a batch of one."""
    if len(ids) > DECODE_INLINE_TOKENS:
        return tokenizer.decode_batch([list(ids)], skip_special_tokens=False)[0]
    return tokenizer.decode(list(ids), skip_special_tokens=False)


def byte_level(tokenizer: Tokenizer, name: str) -> Detokenizer | None:
    """The core's table of `tokenizer`, or None (`tokenizers` decodes) where its decoder is
    not byte-level."""
    try:
        return load_backend().Detokenizer(tokenizer.to_str())
    except TokenizerError as err:
        logger.debug("%s is decoded through tokenizers: %s", name, err)
        return None
