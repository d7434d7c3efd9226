"""A turn cut by its `max_tokens` keeps its signal: the next prompt continues its sampled ids
exactly (the template's end of the turn appended), so no later turn falls back and nothing is
masked `realigned`; the turn is flagged `length_truncated` in the ledger and its samples."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from support.length_session import LENGTH_SCRIPT, PiecesEngine, length_session
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.integrations.slime.sample import CompatSample, SampleStatus
from tokentrail.integrations.slime.trajectory import slime_samples
from tokentrail.text.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def spliced(tokenizer):
    return asyncio.run(length_session(tokenizer))


def test_cut_turns_train_every_token(spliced) -> None:
    trajectory, stops = spliced
    cut = [stop == "max_tokens" for stop in stops]
    # Cut mid-word, mid-call and mid-thought; one short answer ends on its own.
    assert sum(cut) == len(LENGTH_SCRIPT) - 1 and not cut[3]
    ledger = trajectory.ledger
    assert [t.length_truncated for t in ledger.turns] == cut
    assert ledger.to_dict()["length_truncated_turns"] == sum(cut)
    # Every later turn spliced onto the cut one's ids: no fallback, no realignment.
    assert [t.history_label for t in ledger.turns] == ["render"] + ["splice"] * (len(cut) - 1)
    assert ledger.splice_fallbacks == {}
    assert ledger.masked_tokens == {}
    assert ledger.trained_tokens == ledger.generated_tokens
    assert set(trajectory.drift_counts) == {"clean"}
    (sample,) = trajectory.samples
    assert sample.trained_tokens == ledger.generated_tokens
    assert sample.metadata["length_truncated"] is True
    # The mid-call reply did not parse: it trains as sampled all the same.
    assert sample.metadata["ill_formed"] is True


def test_the_next_prompt_holds_the_cut_ids_as_sampled(tokenizer, spliced) -> None:
    trajectory, _ = spliced
    (sample,) = trajectory.samples
    im_end = tokenizer.added_tokens["<|im_end|>"]
    tokens = sample.tokens.tolist()
    for p, row in zip(trajectory.placements[0], trajectory.ledger.turns, strict=True):
        output = tokens[p.start : p.end]
        assert len(output) == row.generated
        if row.length_truncated:
            # No end token was sampled; the template's follows the sampled ids (the last
            # turn's too, once a next prompt holds it).
            assert im_end not in output
            assert p.end == len(tokens) or tokens[p.end] == im_end
        else:
            assert output[-1] == im_end


def test_the_slow_path_agrees_where_ids_re_encode(tokenizer, spliced) -> None:
    """With ids that re-encode as sampled, splicing and rendering every prompt in full give
    the same samples; with ids that do not, only the splice keeps them (the render masks the
    drift as `realigned`)."""

    def run(history: str, engine_cls: type[ScriptedEngine]):
        engine = engine_cls(tokenizer, LENGTH_SCRIPT)
        return asyncio.run(length_session(tokenizer, history=history, engine=engine))[0]

    fast, slow = run("splice", ScriptedEngine), run("render", ScriptedEngine)
    assert len(fast.samples) == len(slow.samples) == 1
    a, b = fast.samples[0], slow.samples[0]
    assert np.array_equal(a.tokens, b.tokens)
    assert np.array_equal(a.loss_mask, b.loss_mask)
    assert np.array_equal(a.rollout_log_probs, b.rollout_log_probs)
    assert fast.ledger.trained_tokens == slow.ledger.trained_tokens
    rendered = run("render", PiecesEngine)
    assert rendered.ledger.generated_tokens == spliced[0].ledger.generated_tokens
    assert rendered.ledger.masked_tokens.get("realigned", 0) > 0
    assert spliced[0].ledger.masked_tokens == {}


def test_slime_sees_the_cut_for_its_overlong_policy(spliced) -> None:
    trajectory, _ = spliced
    (slime,) = slime_samples(trajectory, CompatSample(index=0))
    # The last turn was cut: the rollout ended on a truncation, as slime's status says.
    assert slime.status is SampleStatus.TRUNCATED
    assert slime.metadata["length_truncated"] is True
    assert [t["length_truncated"] for t in slime.metadata["ledger"]] == [
        t.length_truncated for t in trajectory.ledger.turns
    ]
