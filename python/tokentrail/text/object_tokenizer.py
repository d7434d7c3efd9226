"""A tokenizer object tokentrail has no `tokenizers` backend for, used through its own methods.

A slow `transformers` tokenizer, or any object with `apply_chat_template`, `encode` and
`decode` (slime's test tokenizers), works as a `LoadedTokenizer` whose prompts are the ids the
object's `apply_chat_template(..., tokenize=True)` returns and whose text is its `decode`: the
reference path, in Python. What is lost is logged once per object: prompts are rendered in
full every turn (no splice onto the held tokens, no incremental encoding), and the Rust core's
tokenizer fast paths do not apply. Every turn built this way says so in the ledger
(`Fallback.REFERENCE_TOKENIZER`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from tokenizers import Tokenizer, models

from tokentrail.errors import TokenizerError
from tokentrail.text.tokenizer import LoadedTokenizer

logger = logging.getLogger(__name__)

# What an object without a vocabulary size may sample: any uint32 id.
_ANY_ID = 2**32 - 1


@runtime_checkable
class ChatTokenizer(Protocol):
    """What tokentrail needs of a tokenizer object it has no backend for."""

    def apply_chat_template(self, conversation: Any, *args: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, *args: Any, **kwargs: Any) -> Any: ...

    def decode(self, ids: Any, *args: Any, **kwargs: Any) -> str: ...


@dataclass(frozen=True, eq=False)
class ObjectTokenizer(LoadedTokenizer):
    """A `LoadedTokenizer` over a tokenizer object's own methods (see the module docstring).
    Its `tokenizer` is an empty `tokenizers` model nothing reads: every method is the
    object's."""

    source: Any = None

    def __post_init__(self) -> None:
        # No end token is assumed: an object without an eos token ends turns on none.
        pass

    @property
    def vocab_size(self) -> int:
        size = getattr(self.source, "__len__", None)
        return int(size()) if size is not None else _ANY_ID

    def encode(self, text: str) -> list[int]:
        try:
            ids = self.source.encode(text, add_special_tokens=False)
        except TypeError:  # an encode without transformers' keyword
            ids = self.source.encode(text)
        return [int(t) for t in ids]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.source.decode([int(t) for t in ids], skip_special_tokens=False))

    def token_id(self, token: str) -> int:
        convert = getattr(self.source, "convert_tokens_to_ids", None)
        tid = convert(token) if convert is not None else None
        if not isinstance(tid, int) or tid < 0:
            raise TokenizerError(f"{token!r} is not a token of {self.name}")
        return tid

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The prompt text: the object's `apply_chat_template(..., tokenize=False)`, or, for an
        object that renders ids only, the decode of its ids (prompts are its ids either way)."""
        text = self.source.apply_chat_template(
            list(messages),
            tools=None if tools is None else list(tools),
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
        if isinstance(text, str):
            return text
        return self.decode(self.render_ids(messages, tools, add_generation_prompt))

    def render_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """The prompt ids the object's `apply_chat_template(..., tokenize=True)` gives."""
        out = self.source.apply_chat_template(
            list(messages),
            tools=None if tools is None else list(tools),
            tokenize=True,
            add_generation_prompt=add_generation_prompt,
        )
        if isinstance(out, Mapping) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        return [int(t) for t in out]


def from_object(obj: Any) -> ObjectTokenizer:
    """The `ObjectTokenizer` of `obj`; raises `TokenizerError` unless it has
    `apply_chat_template`, `encode` and `decode`. Warns once what the reference path loses."""
    if not isinstance(obj, ChatTokenizer):
        raise TokenizerError(
            f"{type(obj).__name__} is not a fast tokenizer (no `tokenizers` backend) and lacks "
            "apply_chat_template, encode or decode to be used through its own methods"
        )
    name = str(getattr(obj, "name_or_path", "") or type(obj).__name__)
    eos, eos_id = getattr(obj, "eos_token", None), getattr(obj, "eos_token_id", None)
    if not isinstance(eos, str) or not isinstance(eos_id, int):
        eos, eos_id = "", -1
    logger.warning(
        "%s is not a fast tokenizer (no `tokenizers` backend): its prompts are its own "
        "apply_chat_template ids, rendered in full every turn in Python. Lost: splicing onto "
        "the held tokens, incremental encoding and the Rust core's tokenizer fast path",
        name,
    )
    return ObjectTokenizer(
        tokenizer=Tokenizer(models.WordLevel({}, unk_token=None)),
        chat_template="",
        name=name,
        eos_token=eos,
        eos_token_id=eos_id,
        end_token_ids=frozenset({eos_id}) if eos_id >= 0 else frozenset(),
        source=obj,
    )


__all__ = ["ChatTokenizer", "ObjectTokenizer", "from_object"]
