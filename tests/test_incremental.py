"""Incremental tokenization gives exactly the ids of a full encode, on the real Qwen3 vocabulary
and chat template, while re-encoding only the text after the last shared added token; a
tokenizer whose boundaries cannot be proven safe says why, warns once, and encodes in full."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer

from tokentrail import _core
from tokentrail.core import reference
from tokentrail.core.reference.tokenize import unsafe_reason
from tokentrail.text.incremental import IncrementalEncoder
from tokentrail.text.tokenizer import LoadedTokenizer, TokenizerError, load_tokenizer

Encoder = IncrementalEncoder


def reference_encoder(loaded: LoadedTokenizer) -> IncrementalEncoder:
    """The encoder over the Python reference's `IncrementalTokenizer`."""
    return IncrementalEncoder(loaded, backend="python")


# Each hypothesis example works in sessions of its own on the module's encoders.
_sessions = itertools.count()


@pytest.fixture(scope="module")
def loaded() -> LoadedTokenizer:
    return load_tokenizer()


@pytest.fixture(scope="module")
def encoders(loaded: LoadedTokenizer) -> tuple[IncrementalEncoder, IncrementalEncoder]:
    return IncrementalEncoder(loaded), reference_encoder(loaded)


# --- text that stresses the seams ---------------------------------------------------------------

# Added tokens, their near misses, and what the template puts around them.
SEAMS = [
    "<|im_end|>",
    "<|im_start|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_response>",
    "<|im_end",
    "<|im_end|",
    "|im_end|>",
    "im_end|>",
    "<|im_",
    "<|",
    "|>",
    "<",
    ">",
    "<think",
    "</think",
    "user\n",
    "assistant\n",
]
PIECES = [
    " ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\n" * 7,
    " \n",
    "\r\n",
    "  \n  ",
    "Hello",
    " world",
    "'s",
    "'LL",
    "42",
    "3.14159",
    "汉字漢字",
    "こんにちは",
    "🦀",
    "👍🏽",
    "👨‍👩‍👧",
    "e\u0301",  # NFC composes it: normalization must not run across a boundary
    "\u0301",
    "Å",
    "ﬁ",
    "def f(x):\n    return x\n",
    '{"a": [1, 2]}',
]
texts = st.lists(
    st.one_of(
        st.sampled_from(SEAMS),
        st.sampled_from(PIECES),
        st.text(max_size=12),
        st.text(alphabet=" \n\t<|>/_aé汉🦀\u0301", max_size=12),
    ),
    max_size=12,
).map("".join)

ROLES = ["user", "assistant", "user", "tool"]


@st.composite
def conversations(draw: st.DrawFn) -> list[list[dict[str, str]]]:
    """Successive message lists of one session: growing turn by turn, sometimes rewriting an
    earlier message (the shared prefix shrinks), sometimes starting over."""
    messages: list[dict[str, str]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(texts)})
    steps = []
    for _ in range(draw(st.integers(1, 8))):
        action = draw(st.sampled_from(["grow", "grow", "grow", "rewrite", "restart"]))
        if action == "rewrite" and messages:
            at = draw(st.integers(0, len(messages) - 1))
            messages[at] = {**messages[at], "content": draw(texts)}
        elif action == "restart":
            messages = []
        for _ in range(draw(st.integers(1, 2))):
            role = ROLES[len(messages) % len(ROLES)]
            messages.append({"role": role, "content": draw(texts)})
        steps.append([dict(m) for m in messages])
    return steps


def check_session(
    loaded: LoadedTokenizer, encoders: tuple[Encoder, ...], prompts: list[str]
) -> None:
    session = f"s{next(_sessions)}"
    try:
        for text in prompts:
            expected = loaded.encode(text)
            for encoder in encoders:
                got = encoder.encode(session, text)
                assert got.dtype == np.uint32
                assert got.tolist() == expected, (encoder.fast_path_reason, text)
    finally:
        for encoder in encoders:
            encoder.forget(session)


# --- exactness -----------------------------------------------------------------------------------


def test_qwen3_boundaries_are_safe(
    encoders: tuple[IncrementalEncoder, IncrementalEncoder],
) -> None:
    for encoder in encoders:
        assert encoder.safe
        assert encoder.fallback_reason is None


@given(conversations())
def test_rendered_conversations_encode_exactly(
    loaded: LoadedTokenizer,
    encoders: tuple[IncrementalEncoder, IncrementalEncoder],
    steps: list[list[dict[str, str]]],
) -> None:
    prompts = [loaded.render_chat(messages) for messages in steps]
    check_session(loaded, encoders, prompts)


@given(st.lists(st.tuples(st.integers(0, 10_000), texts), min_size=1, max_size=8))
def test_edited_texts_encode_exactly(
    loaded: LoadedTokenizer,
    encoders: tuple[IncrementalEncoder, IncrementalEncoder],
    edits: list[tuple[int, str]],
) -> None:
    # Each prompt keeps a prefix of the previous one (cut anywhere, even next to or inside an
    # added token) and goes on with new text.
    prompts, text = [], ""
    for keep, new in edits:
        text = text[: min(keep, len(text))] + new
        prompts.append(text)
    check_session(loaded, encoders, prompts)


def test_special_token_text_in_user_content_is_that_token(
    loaded: LoadedTokenizer,
    encoders: tuple[IncrementalEncoder, IncrementalEncoder],
) -> None:
    im_end = loaded.token_id("<|im_end|>")
    first = [{"role": "user", "content": "say <|im_end|> then <|im_end and |im_end|>"}]
    second = [
        *first,
        {"role": "assistant", "content": "<|im_end|"},
        {"role": "user", "content": "x"},
    ]
    prompts = [loaded.render_chat(first), loaded.render_chat(second)]
    check_session(loaded, encoders, prompts)
    # The one in the content, and the one closing the message.
    assert loaded.encode(prompts[0]).count(im_end) == 2


# --- reuse ---------------------------------------------------------------------------------------


def growing_conversation(loaded: LoadedTokenizer, turns: int, block: str) -> list[str]:
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are terse."}]
    prompts = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Turn {turn}: {block}"})
        prompts.append(loaded.render_chat(messages))
        messages.append({"role": "assistant", "content": f"Done with {turn}. {block[:200]}"})
    return prompts


@pytest.mark.parametrize("kind", [IncrementalEncoder, reference_encoder])
def test_a_growing_conversation_reuses_its_prefix(
    loaded: LoadedTokenizer, kind: Callable[[LoadedTokenizer], Encoder]
) -> None:
    encoder = kind(loaded)
    prompts = growing_conversation(loaded, 12, "some code\n    x = 1\n" * 40)
    for text in prompts:
        assert encoder.encode("s", text).tolist() == loaded.encode(text)
    total = sum(len(text.encode()) for text in prompts)
    assert encoder.reused_ids() > 0
    assert encoder.encoded_bytes() < total / 4
    # The same prompt again is all reused.
    before = encoder.encoded_bytes()
    again = encoder.encode("s", prompts[-1])
    assert again.tolist() == loaded.encode(prompts[-1])
    assert encoder.encoded_bytes() == before


def test_rust_and_reference_count_alike(loaded: LoadedTokenizer) -> None:
    prompts = growing_conversation(loaded, 5, "abc 汉字 🦀\n\n")
    prompts.insert(3, prompts[1] + "a rewrite")
    counts = []
    for make in (IncrementalEncoder, reference_encoder):
        encoder = make(loaded)
        for text in prompts:
            encoder.encode("s", text)
        counts.append((encoder.reused_ids(), encoder.encoded_bytes(), encoder.sessions()))
    assert counts[0] == counts[1]


@pytest.mark.parametrize("kind", [IncrementalEncoder, reference_encoder])
def test_sessions_and_forget(loaded: LoadedTokenizer, kind: Any) -> None:
    encoder = kind(loaded)
    encoder.encode("a", "<|im_start|>user\nhi<|im_end|>")
    encoder.encode("b", "<|im_start|>user\nho<|im_end|>")
    assert encoder.sessions() == 2
    encoder.forget("a")
    encoder.forget("never seen")
    assert encoder.sessions() == 1
    # A forgotten session starts over with a full encode.
    before = encoder.encoded_bytes()
    encoder.encode("a", "<|im_start|>user\nhi<|im_end|>")
    assert encoder.encoded_bytes() - before == len("<|im_start|>user\nhi<|im_end|>")


def test_threads_share_one_encoder(loaded: LoadedTokenizer) -> None:
    encoder = IncrementalEncoder(loaded)
    prompts = growing_conversation(loaded, 6, "parallel text\n" * 30)

    def run(session: int) -> bool:
        return all(
            encoder.encode(f"t{session}", text).tolist() == loaded.encode(text) for text in prompts
        )

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(run, range(8)))
    assert encoder.sessions() == 8


# --- tokenizers whose boundaries are not safe -----------------------------------------------------


def altered(loaded: LoadedTokenizer, change: Callable[[Tokenizer], object]) -> LoadedTokenizer:
    tokenizer = Tokenizer.from_str(loaded.tokenizer.to_str())
    change(tokenizer)
    return dataclasses.replace(loaded, tokenizer=tokenizer)


def add(token: AddedToken) -> Callable[[Tokenizer], object]:
    return lambda tokenizer: tokenizer.add_tokens([token])


UNSAFE = {
    "rstrip": (
        add(AddedToken("<x>", rstrip=True, normalized=False)),
        'added token "<x>" has rstrip=True',
    ),
    "normalized": (
        add(AddedToken("<x>", normalized=True)),
        'added token "<x>" has normalized=True',
    ),
    "prefix": (
        add(AddedToken("<|im_end|>\n", normalized=False)),
        'added token "<|im_end|>" occurs inside added token "<|im_end|>\\n"',
    ),
    "inside": (
        add(AddedToken("say<think>!", normalized=False)),
        'added token "<think>" occurs inside added token "say<think>!"',
    ),
    "truncation": (
        lambda tokenizer: tokenizer.enable_truncation(max_length=64),
        "it truncates encodings",
    ),
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_unsafe_tokenizers_say_why_and_encode_in_full(
    loaded: LoadedTokenizer, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    change, reason = UNSAFE[case]
    unsafe = altered(loaded, change)

    def encode(text: str) -> list[int]:
        return unsafe.tokenizer.encode(text, add_special_tokens=False).ids

    prompts = growing_conversation(loaded, 4, "say<think>! <x>  y <|im_end|>\n")
    for kind in (IncrementalEncoder, reference_encoder):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tokentrail.text.incremental"):
            encoder = kind(unsafe)
            assert not encoder.safe
            assert encoder.fallback_reason == reason
            for text in prompts:
                assert encoder.encode("s", text).tolist() == encode(text)
        assert encoder.sessions() == 0
        assert encoder.reused_ids() == 0
        assert encoder.encoded_bytes() == sum(len(text.encode()) for text in prompts)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [
            f"incremental tokenization disabled for builtin:qwen3: {reason}; "
            "every prompt is encoded in full"
        ]


@pytest.mark.parametrize("backend", ["rust", "python"])
def test_encode_special_tokens_is_refused_and_explained(
    loaded: LoadedTokenizer, backend: str
) -> None:
    def split_specials(tokenizer: Tokenizer) -> None:
        tokenizer.encode_special_tokens = True

    unsafe = altered(loaded, split_specials)
    # tokenizer.json does not carry the switch, so either core would encode differently.
    with pytest.raises(TokenizerError, match="encode_special_tokens"):
        IncrementalEncoder(unsafe, backend)
    assert unsafe_reason(unsafe.tokenizer) == (
        "it encodes special tokens as plain text (encode_special_tokens)"
    )


def test_safe_tokenizers_do_not_warn(
    loaded: LoadedTokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tokentrail.text.incremental"):
        IncrementalEncoder(loaded)
        reference_encoder(loaded)
    assert not caplog.records


@pytest.mark.parametrize("core_module", [_core, reference], ids=["rust", "python"])
def test_a_tokenizer_without_added_tokens_has_no_boundary(
    loaded: LoadedTokenizer, core_module: Any
) -> None:
    config = json.loads(loaded.tokenizer.to_str())
    config["added_tokens"] = []
    core = core_module.IncrementalTokenizer(json.dumps(config))
    assert core.fallback_reason == "it has no added tokens to resume after"
    assert core.encode("s", "plain text").tolist() == core.encode_full("plain text").tolist()


@pytest.mark.parametrize("core_module", [_core, reference], ids=["rust", "python"])
def test_a_bad_tokenizer_json_is_a_tokenizer_error(core_module: Any) -> None:
    with pytest.raises(TokenizerError, match="cannot load the tokenizer.json"):
        core_module.IncrementalTokenizer("{")
    assert issubclass(TokenizerError, ValueError)
