"""No silent loss, under every transcript rewrite a harness makes.

Random combinations of harness behaviours drive the adapter over HTTP. For every session: the
ledger accounts for exactly the tokens the engine generated; every generated turn is trained
or masked with a named reason; and every trained token sits in a sample exactly where the
model produced it, after exactly the prompt it saw.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentrail.kinds import MaskReason
from tokentrail.sim.harness import Behaviour, SessionSpec, simulate
from tokentrail.sim.model import SimulatedEngine
from tokentrail.text.tokenizer import load_tokenizer

# What these harness behaviours may mask a generated token for: nothing else, never unaccounted.
NAMED_REASONS = {MaskReason.REALIGNED, MaskReason.MERGED_REWRITE, MaskReason.TRUNCATED}


class RecordingEngine(SimulatedEngine):
    """The simulated model, remembering every (prompt ids, output ids) it served."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.calls: list[tuple[list[int], list[int]]] = []

    async def generate(self, req):
        generation = await super().generate(req)
        self.calls.append((list(req.input_ids), list(generation.output_ids)))
        return generation


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


behaviours = st.builds(
    Behaviour,
    rerender_echoes=st.booleans(),
    move_cache_control=st.booleans(),
    system_notes=st.booleans(),
    verify_on_stop=st.booleans(),
    nudge_role=st.sampled_from(["user", "system"]),
    strip_nudge=st.booleans(),
    drop_full_answer=st.booleans(),
    subagents=st.booleans(),
    compaction=st.booleans(),
    retries=st.booleans(),
    strip_reasoning=st.booleans(),
)
specs = st.builds(
    SessionSpec,
    seed=st.integers(0, 10_000),
    steps=st.integers(1, 7),
    tasks=st.integers(1, 2),
    context_tokens=st.sampled_from([500, 3000]),
    think=st.sampled_from([0.0, 0.5, 1.0]),
    answer_words=st.sampled_from([5, 60]),
)


def trained_runs_are_what_the_model_produced(sample, calls) -> None:
    tokens = sample.tokens.tolist()
    mask = sample.loss_mask.tolist()
    prompt_len = sample.prompt_length
    pos = 0
    while pos < len(mask):
        if not mask[pos]:
            pos += 1
            continue
        end = pos
        while end < len(mask) and mask[end]:
            end += 1
        a, b = prompt_len + pos, prompt_len + end
        assert any(
            len(inp) <= a
            and tokens[: len(inp)] == inp
            and tokens[len(inp) : b] == out[: b - len(inp)]
            for inp, out in calls
        ), f"trained tokens [{a}, {b}) were not sampled after the prompt that precedes them"
        pos = end


@settings(max_examples=30, deadline=None)
@given(
    behaviour=behaviours,
    spec=specs,
    protocol=st.sampled_from(["anthropic", "openai", "responses"]),
    restore=st.sampled_from(["on", "off"]),
    rewrite_policy=st.sampled_from(["merge", "fork"]),
)
def test_every_generated_token_is_accounted_for(
    tokenizer, behaviour, spec, protocol, restore, rewrite_policy
) -> None:
    engine = RecordingEngine(tokenizer)
    run = asyncio.run(
        simulate(
            tokenizer,
            behaviour=behaviour,
            spec=spec,
            protocol=protocol,
            restore=restore,
            rewrite_policy=rewrite_policy,
            engine=engine,
        )
    )
    ledger = run.trajectory.ledger
    generated = sum(len(out) for _, out in engine.calls)
    assert ledger.generated_tokens == generated > 0
    # Every generation is one ledger turn of its own length: none lost, none counted twice.
    assert sorted(t.generated for t in ledger.turns) == sorted(len(out) for _, out in engine.calls)
    for turn in ledger.turns:
        assert turn.trained + sum(turn.masked.values()) == turn.generated
        assert set(turn.masked) <= NAMED_REASONS, turn
    for sample in run.trajectory.samples:
        trained_runs_are_what_the_model_produced(sample, engine.calls)
    if rewrite_policy == "fork":
        assert MaskReason.MERGED_REWRITE not in ledger.masked_tokens
