"""The core's byte-level detokenizer (`_core.Detokenizer`, its reference) against `tokenizers`'
`decode` on the real vocabularies: generated ids, added tokens, characters cut short, ids
with no token, and the text of a real turn."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders

from tokentrail.core.backend import load_backend
from tokentrail.errors import TokenizerError
from tokentrail.text import detokenize
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer

VOCABULARIES = ["builtin:qwen3", "builtin:deepseek", "builtin:o200k_harmony", "builtin:llama3"]


@pytest.fixture(scope="module", params=VOCABULARIES)
def loaded(request: pytest.FixtureRequest) -> LoadedTokenizer:
    return load_tokenizer(request.param)


def _slow(tok: Tokenizer, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def _generated(loaded: LoadedTokenizer, rng: random.Random) -> list[int]:
    """Ids drawn from the whole table (added tokens included, some past it), multi-byte
    characters cut anywhere, and text with markup."""
    n = loaded.vocab_size
    kind = rng.randrange(3)
    if kind == 0:
        return [rng.randrange(n + 8) for _ in range(rng.randrange(64))]
    text = rng.choice(["héllo wörld ✓ 你好 🙂", "<think>x</think>\n```py\nprint(1)\n```", "  \t\n"])
    ids = loaded.encode(text * rng.randrange(1, 4))
    added = list(loaded.added_tokens.values())
    if kind == 1 and ids:
        cut = rng.randrange(len(ids) + 1)
        return ids[:cut] + rng.sample(added, min(2, len(added))) + ids[cut:]
    return ids[: rng.randrange(len(ids) + 1)]


@pytest.mark.parametrize("backend", ["rust", "python"])
def test_every_generated_run_decodes_as_tokenizers(loaded: LoadedTokenizer, backend: str) -> None:
    core = load_backend(backend)
    detokenizer = core.Detokenizer(loaded.tokenizer.to_str())
    assert len(detokenizer) == loaded.vocab_size
    rng = random.Random(7)
    for _ in range(1500 if backend == "rust" else 300):
        ids = _generated(loaded, rng)
        assert detokenizer.decode(ids) == _slow(loaded.tokenizer, ids), ids


def test_a_long_turn_and_its_array_decode_as_tokenizers(loaded: LoadedTokenizer) -> None:
    text = "Sure, here is the plan: read the module, then edit it. ✓ 你好\n" * 3000
    ids = loaded.encode(text)
    assert len(ids) > 16 * 1024  # past where the core lets go of the interpreter
    detokenizer = load_backend("rust").Detokenizer(loaded.tokenizer.to_str())
    assert detokenizer.decode(ids) == text == _slow(loaded.tokenizer, ids)
    assert detokenizer.decode(np.asarray(ids, dtype=np.int64)) == text


def test_loaded_tokenizers_decode_through_the_table_and_stay_in_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded = load_tokenizer()
    ids = loaded.encode("a <think> b")
    assert loaded.decode(ids) == "a <think> b"
    built = loaded._detokenizer
    assert built is not None and built[1] is not None
    # A token added to the tokenizer afterwards: the table is made again.
    loaded.tokenizer.add_tokens(["<new_marker>"])
    new_id = loaded.tokenizer.token_to_id("<new_marker>")
    assert loaded.decode([*ids, new_id]) == "a <think> b<new_marker>"
    assert loaded._detokenizer is not built
    # The check the suite runs under names a disagreement.
    monkeypatch.setattr(detokenize, "VERIFY_DECODE", True)
    monkeypatch.setattr(detokenize, "decode_slow", lambda tokenizer, ids: "other")
    with pytest.raises(TokenizerError, match="is not tokenizers'"):
        loaded.decode(ids)


def test_a_loaded_tokenizer_pickles_after_a_decode_and_its_copy_decodes_alike() -> None:
    # Worker processes and Ray actors get the tokenizer pickled; the core's table does not
    # pickle, and the copy makes its own.
    loaded = load_tokenizer()
    ids = loaded.encode("héllo <think> wörld")
    text = loaded.decode(ids)
    assert loaded._detokenizer is not None
    copy = pickle.loads(pickle.dumps(loaded))
    assert copy._detokenizer is None and loaded._detokenizer is not None
    assert copy.decode(ids) == text and copy._detokenizer is not None
    assert copy.encode(text) == ids


def test_a_decoder_other_than_byte_level_is_decoded_by_tokenizers() -> None:
    loaded = load_tokenizer()
    tok = Tokenizer.from_str(loaded.tokenizer.to_str())
    tok.decoder = decoders.Metaspace()
    for backend in ("rust", "python"):
        with pytest.raises(TokenizerError, match="its decoder is Metaspace, not ByteLevel"):
            load_backend(backend).Detokenizer(tok.to_str())
    other = LoadedTokenizer(
        tokenizer=tok, chat_template="", name="metaspace", eos_token="<|im_end|>", eos_token_id=1
    )
    ids = tok.encode("▁a b").ids
    assert other.decode(ids) == _slow(tok, ids)
    assert other._detokenizer is not None and other._detokenizer[1] is None


@pytest.mark.parametrize("backend", ["rust", "python"])
def test_a_file_that_is_not_a_tokenizer_is_refused(backend: str) -> None:
    with pytest.raises(TokenizerError, match="cannot read the tokenizer.json"):
        load_backend(backend).Detokenizer('{"model": {}}')
