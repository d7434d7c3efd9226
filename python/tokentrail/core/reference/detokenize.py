"""Reference of `rust/detokenize.rs`: the text of token ids for a tokenizer whose decoder is
`ByteLevel`, as `tokenizers`' `decode` gives it with the special tokens kept.

Each id's token (its added token first, else the vocabulary's) is mapped char by char back to
the bytes GPT-2's byte-level alphabet stands for (a token with a char outside that alphabet is
its own UTF-8 bytes); the bytes of all the ids are read as UTF-8, an invalid sequence becoming
U+FFFD; an id with no token adds nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from tokentrail.core.reference.linearize import token_list
from tokentrail.errors import TokenizerError
from tokentrail.text.vocabularies import bytes_to_unicode

__all__ = ["Detokenizer"]


# GPT-2's printable char of each byte, read back.
_CHARS = {char: byte for byte, char in bytes_to_unicode().items()}


def _token_bytes(token: str) -> bytes:
    try:
        return bytes(_CHARS[c] for c in token)
    except KeyError:
        return token.encode()


class Detokenizer:
    """The bytes of every id of one tokenizer.json, read from its vocabulary and added tokens."""

    def __init__(self, tokenizer_json: str) -> None:
        try:
            file = json.loads(tokenizer_json)
            decoder = file["decoder"]
            model = file["model"]
            vocab: dict[str, int] = model["vocab"]
            added = [(int(t["id"]), str(t["content"])) for t in file.get("added_tokens") or []]
        except (ValueError, KeyError, TypeError) as err:
            raise TokenizerError(f"cannot read the tokenizer.json: {err}") from None
        if decoder is None:
            raise TokenizerError("it has no decoder")
        if decoder.get("type") != "ByteLevel":
            raise TokenizerError(f"its decoder is {decoder.get('type')}, not ByteLevel")
        if model.get("type", "BPE") != "BPE":
            raise TokenizerError("its model is not BPE")
        tokens: dict[int, str] = {}
        for token, id_ in vocab.items():
            if id_ in tokens:
                raise TokenizerError(f"its vocabulary gives several tokens id {id_}")
            tokens[id_] = token
        tokens.update(added)
        count = max(tokens, default=-1) + 1
        self._bytes = [_token_bytes(tokens[i]) if i in tokens else b"" for i in range(count)]

    def decode(self, ids: Sequence[int]) -> str:
        table = self._bytes
        n = len(table)
        return b"".join(table[i] for i in token_list(ids, "ids") if i < n).decode(errors="replace")

    def __len__(self) -> int:
        return len(self._bytes)
