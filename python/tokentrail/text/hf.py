"""A Hugging Face tokenizer object (`transformers.PreTrainedTokenizerFast`) as a `LoadedTokenizer`.

Trainers (slime, verl, TRL) hold a tokenizer object, not a path. Its backend `tokenizers` model
becomes the `LoadedTokenizer`'s (so the Rust core's fast paths apply wherever the core reproduces
it exactly), and its chat template tokentrail's; both are checked, once, against the object's own
`apply_chat_template` and `encode`, so a prompt built here is the one the object would build.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from tokenizers import Tokenizer

from tokentrail.errors import TokenizerError
from tokentrail.text.object_tokenizer import from_object
from tokentrail.text.tokenizer import LoadedTokenizer

logger = logging.getLogger(__name__)


@runtime_checkable
class HFTokenizer(Protocol):
    """What tokentrail reads of a `transformers` fast tokenizer."""

    backend_tokenizer: Tokenizer
    chat_template: Any
    eos_token: Any
    bos_token: Any
    pad_token: Any
    name_or_path: str

    def apply_chat_template(self, conversation: Any, *args: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, *args: Any, **kwargs: Any) -> Any: ...


# Conversations the template must render exactly as the object's own `apply_chat_template`:
# plain turns, a system prompt, a tool call with its result, a reasoning block.
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Search the docs.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]
_PROBES: tuple[tuple[list[dict[str, Any]], list[dict[str, Any]] | None], ...] = (
    ([{"role": "user", "content": "hi"}], None),
    (
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "find slime"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "lookup", "arguments": {"q": "x"}}}
                ],
            },
            {"role": "tool", "content": "found it"},
        ],
        _TOOLS,
    ),
    (
        [
            {"role": "user", "content": "why?"},
            {"role": "assistant", "content": "because", "reasoning_content": "think first"},
            {"role": "user", "content": "and then?"},
        ],
        None,
    ),
)

_WRAPPED: weakref.WeakKeyDictionary[Any, LoadedTokenizer] = weakref.WeakKeyDictionary()


def as_loaded(tokenizer: LoadedTokenizer | HFTokenizer) -> LoadedTokenizer:
    """`tokenizer` itself if it is a `LoadedTokenizer`, else `from_transformers(tokenizer)` for a
    fast tokenizer and `object_tokenizer.from_object(tokenizer)` for any other (once per object:
    later calls return the same `LoadedTokenizer`)."""
    if isinstance(tokenizer, LoadedTokenizer):
        return tokenizer
    try:
        cached = _WRAPPED.get(tokenizer)
    except TypeError:  # not weakly referenceable: wrap every time
        return _wrap(tokenizer)
    if cached is None:
        cached = _WRAPPED[tokenizer] = _wrap(tokenizer)
    return cached


def _wrap(tokenizer: Any) -> LoadedTokenizer:
    """A fast tokenizer through its backend; any other object with `apply_chat_template`,
    `encode` and `decode` through its own methods (`text.object_tokenizer`, with a warning)."""
    if isinstance(getattr(tokenizer, "backend_tokenizer", None), Tokenizer):
        return from_transformers(tokenizer)
    return from_object(tokenizer)


def from_transformers(hf: Any) -> LoadedTokenizer:
    """The `LoadedTokenizer` of a `transformers` fast tokenizer: its backend model, chat template
    and special tokens; the model family whose parsers and stop tokens go with it, if its
    template is a known family's.

    Raises `TokenizerError` for a slow tokenizer (no `tokenizers` backend), one without a chat
    template, or one whose template or encoding tokentrail does not reproduce.
    """
    from tokentrail.text.families import detect_family

    backend = getattr(hf, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise TokenizerError(
            f"{type(hf).__name__} is not a fast tokenizer (no `tokenizers` backend): load it "
            "with AutoTokenizer.from_pretrained(..., use_fast=True)"
        )
    if not isinstance(hf, HFTokenizer):
        raise TokenizerError(f"{type(hf).__name__} lacks apply_chat_template or encode")
    template = _template_of(hf.chat_template)
    name = str(hf.name_or_path or type(hf).__name__)
    # A copy: the object keeps its own backend, and what tokentrail sets never reaches it.
    tok = Tokenizer.from_str(backend.to_str())
    added = {t.content: i for i, t in tok.get_added_tokens_decoder().items()}

    def token(value: Any, what: str) -> tuple[str | None, int | None]:
        text = None if value is None else str(value)
        if text is None:
            return None, None
        tid = tok.token_to_id(text)
        if tid is None:
            raise TokenizerError(f"{name}: its {what} {text!r} is not in its vocabulary")
        return text, int(tid)

    eos, eos_id = token(hf.eos_token, "eos_token")
    if eos is None or eos_id is None:
        raise TokenizerError(f"{name} has no eos_token")
    bos, bos_id = token(hf.bos_token, "bos_token")
    pad, pad_id = token(hf.pad_token, "pad_token")
    fam = detect_family(template)
    ends = {eos_id}
    if fam is not None:
        ends |= {added[t] for t in fam.stop_tokens if t in added}
    loaded = LoadedTokenizer(
        tokenizer=tok,
        chat_template=template,
        name=name,
        eos_token=eos,
        eos_token_id=eos_id,
        bos_token=bos,
        bos_token_id=bos_id,
        pad_token=pad,
        pad_token_id=pad_id,
        added_tokens=added,
        end_token_ids=frozenset(ends),
        family=None if fam is None else fam.name,
    )
    check_same_prompts(hf, loaded)
    return loaded


def check_same_prompts(hf: HFTokenizer, loaded: LoadedTokenizer) -> None:
    """Raise `TokenizerError` unless `loaded` renders and encodes the probe conversations to
    exactly the text and ids `hf.apply_chat_template` gives."""
    for messages, tools in _PROBES:
        try:
            theirs = _render(hf, messages, tools)
        except Exception as exc:  # the object's own template refuses the probe: nothing to hold
            logger.debug("%s: apply_chat_template refused a probe: %s", loaded.name, exc)
            continue
        ours = loaded.render_chat(messages, tools)
        if ours != theirs:
            at = next(
                (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None
            )
            at = min(len(ours), len(theirs)) if at is None else at
            raise TokenizerError(
                f"{loaded.name}: tokentrail renders its chat template differently from its "
                f"apply_chat_template, from character {at}: {ours[at : at + 40]!r} vs "
                f"{theirs[at : at + 40]!r}"
            )
        their_ids = [int(i) for i in hf.encode(theirs, add_special_tokens=False)]
        if loaded.encode(ours) != their_ids:
            raise TokenizerError(
                f"{loaded.name}: its backend tokenizer encodes a rendered prompt differently "
                "from its encode()"
            )


def _render(hf: HFTokenizer, messages: list[dict[str, Any]], tools: Any) -> str:
    text = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str):
        raise TokenizerError("apply_chat_template(tokenize=False) did not return text")
    return text


def _template_of(value: Any) -> str:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, Mapping):  # named templates: the default one, as transformers picks
        if isinstance(value.get("default"), str):
            return str(value["default"])
        named = [v for v in value.values() if isinstance(v, str)]
        if named:
            return named[0]
    if isinstance(value, Sequence) and not isinstance(value, str):
        for entry in value:
            if isinstance(entry, Mapping) and entry.get("name", "default") == "default":
                return str(entry["template"])
    raise TokenizerError("the tokenizer has no chat template: set tokenizer.chat_template")
