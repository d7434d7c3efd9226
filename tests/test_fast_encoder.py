"""The core's fast encoder gives exactly the ids `tokenizers` gives, on every builtin vocabulary
(all of which take the fast path), for code, prose, unicode that NFC changes, whitespace and digit
runs, long runs of one char, added tokens in the text, and sessions that grow; a tokenizer it
cannot reproduce says why and is encoded by `tokenizers`."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

from support import fixtures
from tokentrail import _core
from tokentrail.text.incremental import IncrementalEncoder
from tokentrail.text.tokenizer import QWEN3_PATTERN, LoadedTokenizer

# A family of each builtin vocabulary: qwen3, qwen3.6, deepseek, o200k_harmony, llama3.
FAMILIES = ["qwen3", "qwen3.6", "deepseek-v3.1", "gpt-oss", "llama3"]

_sessions = itertools.count()


@pytest.fixture(scope="module", params=FAMILIES)
def vocabulary(
    request: pytest.FixtureRequest, family_tokenizer: Callable[[str], LoadedTokenizer]
) -> tuple[LoadedTokenizer, IncrementalEncoder]:
    """A builtin vocabulary (loaded once per test session, shared with other modules) and an
    encoder of it."""
    loaded = family_tokenizer(request.param)
    return loaded, IncrementalEncoder(loaded)


Vocabulary = tuple[LoadedTokenizer, IncrementalEncoder]


def expected(loaded: LoadedTokenizer, text: str) -> list[int]:
    return list(loaded.tokenizer.encode(text, add_special_tokens=False).ids)


def added_contents(loaded: LoadedTokenizer) -> list[str]:
    decoder = loaded.tokenizer.get_added_tokens_decoder()
    return sorted(token.content for token in decoder.values())[:64]


# --- text ---------------------------------------------------------------------------------------

FRAGMENTS = [
    "def f(x):\n    return x + 1\n",
    "if (a && b) { return c[i]; }",
    "    ",
    "\t\t",
    "\n",
    "\n\n\n",
    " \n ",
    "\r\n",
    "   \n",
    "Hello",
    " world",
    "It's",
    " they're",
    " WE'LL",
    "'s",
    "'ve",
    "1234567",
    " 42",
    "3.14159",
    "汉字",
    "日本語のテキスト",
    "カタカナ",
    "한국어",
    "🦀",
    "👨‍👩‍👧",
    "e\u0301",  # NFC composes it
    "A\u030a",
    "\u212b",  # the Angstrom sign: NFC maps it to Å
    "\u1100\u1161",  # Hangul jamo: NFC composes them
    "a\u0323\u0307",  # two combining marks in non-canonical order
    "café",
    "naïve résumé",
    "ü",
    "/path/to/file.py:12",
    "$ ls -la | grep x",
    '{"key": "value"}',
    "<",
    "|>",
    "<|",
    "<think",
    "\u00a0",
    "\u3000",
    " ",
]


@st.composite
def texts(draw: st.DrawFn, added: list[str]) -> str:
    parts = st.one_of(
        st.sampled_from(FRAGMENTS),
        st.sampled_from(added),
        st.text(max_size=8),
        st.builds(
            lambda char, n: char * n,
            st.sampled_from([" ", "\n", "a", "1", "\t", "汉", "!", "e\u0301"]),
            st.integers(1, 40),
        ),
    )
    return "".join(draw(st.lists(parts, max_size=24)))


# One long run of a single char now and then, costly enough to keep out of most examples.
LONG_RUNS = [" ", "\n", "a", "7", "\t", "-", "汉", "é", " \n"]


# --- which vocabularies take the fast path ------------------------------------------------------


def test_every_builtin_takes_the_fast_path(vocabulary: Vocabulary) -> None:
    _, encoder = vocabulary
    assert encoder.fast_path_reason is None
    assert encoder.fast_path


@given(data=st.data())
def test_full_encodes_give_the_ids_tokenizers_gives(
    vocabulary: Vocabulary, data: st.DataObject
) -> None:
    loaded, encoder = vocabulary
    text = data.draw(texts(added_contents(loaded)))
    assert encoder.encode_full(text).tolist() == expected(loaded, text)


@given(data=st.data())
def test_growing_sessions_give_the_ids_tokenizers_gives(
    vocabulary: Vocabulary, data: st.DataObject
) -> None:
    loaded, encoder = vocabulary
    session = f"s{next(_sessions)}"
    strategy = texts(added_contents(loaded))
    text = data.draw(strategy)
    for _ in range(3):
        assert encoder.encode(session, text).tolist() == expected(loaded, text)
        text += data.draw(strategy)
    encoder.forget(session)


def test_long_runs_give_the_ids_tokenizers_gives(vocabulary: Vocabulary) -> None:
    loaded, encoder = vocabulary
    for char in LONG_RUNS:
        for text in (char * 5001, f"x{char * 6000}y", f"{char * 3000}<|im_end|>{char * 2000}"):
            assert encoder.encode_full(text).tolist() == expected(loaded, text), repr(char)


# --- real traffic -------------------------------------------------------------------------------


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def fixture_texts() -> list[str]:
    found = []
    for path in sorted(fixtures.FIXTURES.glob("*.json")):
        found.extend(s for s in strings(json.loads(path.read_text())) if s)
    return found


def test_real_traffic_gives_the_ids_tokenizers_gives(vocabulary: Vocabulary) -> None:
    loaded, encoder = vocabulary
    found = fixture_texts()
    assert len(found) > 100
    wrong = [s[:60] for s in found if encoder.encode_full(s).tolist() != expected(loaded, s)]
    assert wrong == []
    # And as one growing session, the way a conversation arrives.
    session = f"s{next(_sessions)}"
    text = ""
    for piece in found[:200]:
        text += piece
        assert encoder.encode(session, text).tolist() == expected(loaded, text)
    assert encoder.reused_ids() > 0


# --- the fallback -------------------------------------------------------------------------------


def small_tokenizer(**changes: Any) -> str:
    """A small byte-level BPE shaped like Qwen's (NFC, the Split regex, ByteLevel, ChatML added
    tokens), with `changes` made to its tokenizer.json."""
    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(byte_chars))}
    merges = [("Ġ", "Ġ"), ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "t"), ("Ċ", "Ċ")]
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.normalizer = normalizers.NFC()
    split = pre_tokenizers.Split(Regex(QWEN3_PATTERN), behavior="isolated")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    tokenizer.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    config = json.loads(tokenizer.to_str())
    config.update(changes)
    return json.dumps(config)


TEXT = "<|im_start|>user\ne\u0301 汉字 it's   the 42<|im_end|>\n  "


def test_the_small_tokenizer_takes_the_fast_path() -> None:
    core = _core.IncrementalTokenizer(small_tokenizer())
    assert core.fast_path
    reference = Tokenizer.from_str(small_tokenizer())
    assert core.encode_full(TEXT).tolist() == reference.encode(TEXT, add_special_tokens=False).ids


def test_the_fallback_gives_the_same_ids_and_says_why() -> None:
    slow = _core.IncrementalTokenizer(small_tokenizer(), fast_path=False)
    assert not slow.fast_path
    assert slow.fast_path_reason == "the fast path is turned off"
    reference = Tokenizer.from_str(small_tokenizer())
    assert slow.encode_full(TEXT).tolist() == reference.encode(TEXT, add_special_tokens=False).ids


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"normalizer": {"type": "Lowercase"}}, "its normalizer Lowercase is not NFC"),
        (
            {"pre_tokenizer": {"type": "Whitespace"}},
            "its pre-tokenizer does not end with ByteLevel",
        ),
        (
            {
                "pre_tokenizer": {
                    "type": "Split",
                    "pattern": {"Regex": QWEN3_PATTERN},
                    "behavior": "Removed",
                    "invert": False,
                }
            },
            "its pre-tokenizer does not end with ByteLevel",
        ),
    ],
)
def test_a_tokenizer_it_cannot_reproduce_says_why_and_is_encoded_by_tokenizers(
    changes: dict[str, Any], reason: str
) -> None:
    core = _core.IncrementalTokenizer(small_tokenizer(**changes))
    assert core.fast_path_reason == reason
    assert not core.fast_path
    reference = Tokenizer.from_str(small_tokenizer(**changes))
    assert core.encode_full(TEXT).tolist() == reference.encode(TEXT, add_special_tokens=False).ids


def test_a_split_that_drops_its_matches_is_not_reproduced() -> None:
    config = json.loads(small_tokenizer())
    config["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"
    core = _core.IncrementalTokenizer(json.dumps(config))
    assert core.fast_path_reason == "its Split pre-tokenizer is Removed, not Isolated"
    reference = Tokenizer.from_str(json.dumps(config))
    assert core.encode_full(TEXT).tolist() == reference.encode(TEXT, add_special_tokens=False).ids
