"""The reference of incremental tokenization (`rust/tokenize.rs`): a session's next prompt is
encoded from the last added token it shares with the previous one, reusing the ids before it;
the result always equals a full encode. Which tokenizers have such safe boundaries is decided
by the same checks, in the same order, as the core's.
"""

from __future__ import annotations

import bisect
import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

from tokentrail.errors import TokenizerError

__all__ = ["FAST_PATH_REASON", "IncrementalTokenizer", "unsafe_reason"]

# The reference has no fast encoder of its own.
FAST_PATH_REASON = "the Python reference encodes through tokenizers"


@dataclass
class _Session:
    text: str = ""
    ids: list[int] = field(default_factory=list)
    # (character offset right after an added token, ids up to there), in increasing order.
    boundaries: list[tuple[int, int]] = field(default_factory=list)


class IncrementalTokenizer:
    """The core's `IncrementalTokenizer` in pure Python: the same boundaries, decisions and
    counters. It always encodes through `tokenizers` (the ids are the same)."""

    def __init__(self, tokenizer_json: str, *, fast_path: bool = True) -> None:
        try:
            tokenizer = Tokenizer.from_str(tokenizer_json)
        except Exception as err:  # tokenizers raises a bare Exception for a bad file
            raise TokenizerError(f"cannot load the tokenizer.json: {err}") from None
        self._tokenizer = tokenizer
        self.fallback_reason = unsafe_reason(tokenizer)
        self._resumable: dict[int, str] = {}
        if self.fallback_reason is None:
            added = tokenizer.get_added_tokens_decoder()
            self._resumable = {i: token.content for i, token in added.items()}
        self._sessions: dict[str, _Session] = {}
        self._reused_ids = 0
        self._encoded_bytes = 0

    def fork(self) -> IncrementalTokenizer:
        """A tokenizer sharing this one's loaded vocabulary, with no session kept."""
        forked = copy.copy(self)
        forked._sessions, forked._reused_ids, forked._encoded_bytes = {}, 0, 0
        return forked

    @property
    def safe(self) -> bool:
        return self.fallback_reason is None

    @property
    def fast_path(self) -> bool:
        return False

    @property
    def fast_path_reason(self) -> str | None:
        return FAST_PATH_REASON

    def encode(self, session: str, text: str) -> npt.NDArray[np.uint32]:
        if not self.safe:
            self._encoded_bytes += _utf8_len(text)
            return self.encode_full(text)
        state = self._sessions.pop(session, None)
        if state is None:
            state = _Session()
            self._extend(state, text, 0, 0)
        elif state.text == text:
            self._reused_ids += len(state.ids)
        else:
            common = _common_prefix_len(state.text, text)
            kept = bisect.bisect_right(state.boundaries, common, key=lambda b: b[0])
            at, n_ids = state.boundaries[kept - 1] if kept else (0, 0)
            del state.boundaries[kept:]
            del state.ids[n_ids:]
            self._extend(state, text, at, n_ids)
            self._reused_ids += n_ids
        self._sessions[session] = state
        return np.array(state.ids, dtype=np.uint32)

    def encode_full(self, text: str) -> npt.NDArray[np.uint32]:
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return np.array(ids, dtype=np.uint32)

    def forget(self, session: str) -> None:
        self._sessions.pop(session, None)

    def sessions(self) -> int:
        return len(self._sessions)

    def reused_ids(self) -> int:
        return self._reused_ids

    def encoded_bytes(self) -> int:
        return self._encoded_bytes

    def _extend(self, state: _Session, text: str, at: int, n_ids: int) -> None:
        tail = text[at:]
        state.text = text
        if not tail and at > 0:
            return
        encoding = self._tokenizer.encode(tail, add_special_tokens=False)
        self._encoded_bytes += _utf8_len(tail)
        for i, (token_id, (start, end)) in enumerate(
            zip(encoding.ids, encoding.offsets, strict=True)
        ):
            content = self._resumable.get(token_id)
            if content is not None and tail[start:end] == content:
                state.boundaries.append((at + end, n_ids + i + 1))
        state.ids.extend(encoding.ids)


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def _common_prefix_len(a: str, b: str, block: int = 4096) -> int:
    n = min(len(a), len(b))
    start = 0
    while start + block <= n and a[start : start + block] == b[start : start + block]:
        start += block
    while start < n and a[start] == b[start]:
        start += 1
    return start


# --- which tokenizers have safe boundaries ------------------------------------------------------

# Component types known to work on one section of text at a time, knowing nothing else; the
# Rust core lists the same ones. An unknown type is not trusted.
_NORMALIZERS = frozenset(
    {
        "BertNormalizer",
        "Strip",
        "StripAccents",
        "NFC",
        "NFD",
        "NFKC",
        "NFKD",
        "Sequence",
        "Lowercase",
        "Nmt",
        "Precompiled",
        "Replace",
        "Prepend",
        "ByteLevel",
    }
)
_PRE_TOKENIZERS = frozenset(
    {
        "BertPreTokenizer",
        "ByteLevel",
        "CharDelimiterSplit",
        "Metaspace",
        "Whitespace",
        "Sequence",
        "Split",
        "Punctuation",
        "WhitespaceSplit",
        "Digits",
        "UnicodeScripts",
        "FixedLength",
    }
)
_MODELS = frozenset({"BPE", "WordPiece", "WordLevel", "Unigram"})
_POST_PROCESSORS = frozenset(
    {"RobertaProcessing", "BertProcessing", "ByteLevel", "TemplateProcessing", "Sequence"}
)


def unsafe_reason(tokenizer: Tokenizer) -> str | None:
    """Why a boundary right after an added token might not split `tokenizer`'s encodings there,
    or None when it always does; the same checks, in the same order, as the Rust core's
    `tokenize::unsafe_reason`.
    """
    config = json.loads(tokenizer.to_str())
    if config.get("truncation") is not None:
        return "it truncates encodings"
    if config.get("padding") is not None:
        return "it pads encodings"
    if tokenizer.encode_special_tokens:
        return "it encodes special tokens as plain text (encode_special_tokens)"
    added = sorted(config.get("added_tokens") or [], key=lambda token: token["content"])
    if not added:
        return "it has no added tokens to resume after"
    # A normalized token matches the raw text when the normalizer changes nothing.
    identity = config.get("normalizer") is None or _is_identity(config["normalizer"])
    for token in added:
        for flag in ("normalized", "lstrip", "rstrip", "single_word"):
            if token.get(flag) and not (flag == "normalized" and identity):
                return f"added token {_quoted(token['content'])} has {flag}=True"
    reason = _nested_token_reason([token["content"] for token in added])
    if reason is None:
        reason = _straddling_token_reason(added)
    if reason is None and config.get("normalizer") is not None:
        reason = _normalizer_reason(config["normalizer"])
    if reason is None and config.get("pre_tokenizer") is not None:
        reason = _pre_tokenizer_reason(config["pre_tokenizer"])
    if reason is None:
        reason = _model_reason(config["model"])
    if reason is None and config.get("post_processor") is not None:
        reason = _post_processor_reason(config["post_processor"])
    return reason


def _quoted(text: str) -> str:
    # As Rust's `{:?}` shows a string, for the plain characters token contents use.
    return json.dumps(text, ensure_ascii=False)


def _nested_token_reason(contents: list[str]) -> str | None:
    known = set(contents)
    for outer in contents:
        # Every piece of `outer` that ends before its end.
        for start in range(len(outer)):
            for end in range(start + 1, len(outer)):
                inner = outer[start:end]
                if inner in known:
                    return (
                        f"added token {_quoted(inner)} occurs inside added token {_quoted(outer)}"
                    )
    return None


def _is_identity(normalizer: Mapping[str, Any]) -> bool:
    """An empty `Sequence` (or one of such): every text stays as it is."""
    if _kind(normalizer) != "Sequence":
        return False
    return all(_is_identity(n) for n in normalizer["normalizers"])


def _straddling_token_reason(added: list[dict[str, Any]]) -> str | None:
    # Raw-text tokens are matched before normalized ones: one that starts inside a normalized
    # token and ends after it would take that text first once what follows changes.
    raw = [token["content"] for token in added if not token.get("normalized")]
    for token in added:
        if not token.get("normalized"):
            continue
        inner = token["content"]
        for at in range(1, len(inner)):
            tail = inner[at:]
            for outer in raw:
                if len(outer) > len(tail) and outer.startswith(tail):
                    return (
                        f"added token {_quoted(outer)} can start inside normalized added "
                        f"token {_quoted(inner)}"
                    )
    return None


def _kind(component: Mapping[str, Any]) -> str:
    return str(component.get("type"))


def _normalizer_reason(normalizer: Mapping[str, Any]) -> str | None:
    kind = _kind(normalizer)
    if kind not in _NORMALIZERS:
        return f"its normalizer {kind} is not known to work section by section"
    if kind == "Sequence":
        return _first(_normalizer_reason(n) for n in normalizer["normalizers"])
    return None


def _pre_tokenizer_reason(pre_tokenizer: Mapping[str, Any]) -> str | None:
    kind = _kind(pre_tokenizer)
    if kind not in _PRE_TOKENIZERS:
        return f"its pre-tokenizer {kind} is not known to work section by section"
    if kind == "Sequence":
        return _first(_pre_tokenizer_reason(p) for p in pre_tokenizer["pretokenizers"])
    if kind == "Metaspace" and pre_tokenizer.get("prepend_scheme") == "first":
        return "its Metaspace pre-tokenizer prepends only at the start of the text"
    return None


def _model_reason(model: Mapping[str, Any]) -> str | None:
    kind = _kind(model)
    if kind not in _MODELS:
        return f"its model {kind} is not known to encode word by word"
    if kind == "BPE" and (model.get("dropout") or 0.0) > 0.0:
        return "its BPE model has dropout, so encodes are random"
    return None


def _post_processor_reason(processor: Mapping[str, Any]) -> str | None:
    kind = _kind(processor)
    if kind not in _POST_PROCESSORS:
        return f"its post-processor {kind} is not known to keep ids"
    return None


def _first(reasons: Iterable[str | None]) -> str | None:
    return next((reason for reason in reasons if reason is not None), None)
