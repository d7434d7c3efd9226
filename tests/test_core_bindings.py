"""The binding surface of the Rust core `tokentrail._core`.

What goes in (numpy arrays of any integer dtype, lists, tuples), what comes out (numpy arrays
of fixed dtypes, plain dicts and lists), which named exception bad input raises, and a few
hand-built chains checked against `tokentrail.core.reference`.
"""

from __future__ import annotations

import numpy as np
import pytest

from tokentrail import _core
from tokentrail.core import reference
from tokentrail.errors import LogprobLengthError, PolicyError, TokenIdError

# Named tokens: system S, user U1 U2, assistant outputs A1-A3 (turn 0) and B1 B2 (turn 1),
# a re-rendering R3 of A3, and a stray X.
S, U1, U2 = 100, 201, 202
A1, A2, A3 = 301, 302, 303
B1, B2 = 311, 312
R3 = 333
X = 999

FIRST_PROMPT = [S, U1]
FIRST_OUTPUT = [A1, A2, A3]
HELD = FIRST_PROMPT + FIRST_OUTPUT


def one_turn(backend=_core, policy: str = "minimal", fork_threshold: int = 1024):
    builder = backend.SampleBuilder(policy, fork_threshold)
    builder.append_turn(FIRST_PROMPT, FIRST_OUTPUT, [-1.0, -2.0, -3.0], turn=0)
    return builder


def test_constants_mirror_the_reference() -> None:
    assert (_core.CLEAN, _core.REALIGN, _core.FORK) == ("clean", "realign", "fork")
    assert _core.POLICIES == reference.POLICIES == ("minimal", "slime")


# --- token ids in ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ids",
    [
        [S, U1, A1],
        (S, U1, A1),
        [np.int64(S), np.uint32(U1), A1],
        np.array([S, U1, A1], dtype=np.uint32),
        np.array([S, U1, A1], dtype=np.int64),
        np.array([S, U1, A1], dtype=np.int16),
        np.array([S, U1, A1], dtype=np.uint64),
        np.array([S, U1, A1], dtype=">i4"),
        np.array([S, 0, U1, 0, A1], dtype=np.int32)[::2],
    ],
    ids=[
        "list",
        "tuple",
        "numpy-scalars",
        "uint32",
        "int64",
        "int16",
        "uint64",
        "big-endian",
        "strided",
    ],
)
def test_token_ids_are_accepted_in_every_integer_form(ids) -> None:
    assert _core.common_prefix_len(ids, [S, U1, A1, X]) == 3
    builder = _core.SampleBuilder()
    builder.append_turn(ids, ids)
    assert builder.tokens.tolist() == [S, U1, A1, S, U1, A1]


def test_the_largest_id_fits() -> None:
    top = 2**32 - 1
    assert _core.common_prefix_len([top], np.array([top], dtype=np.uint64)) == 1


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([S, -1], "prompt_ids[1]: id -1 is outside [0, 2**32)"),
        ([2**32], "prompt_ids[0]: id 4294967296 is outside [0, 2**32)"),
        ([2**80], "prompt_ids[0]: id 1208925819614629174706176 is outside [0, 2**32)"),
        ([np.int64(-3)], "prompt_ids[0]: id -3 is outside [0, 2**32)"),
        ([S, 1.0], "prompt_ids[1]: expected an int, got float"),
        ([True], "prompt_ids[0]: expected an int, got bool"),
        ([np.True_], "prompt_ids[0]: expected an int, got bool"),
        (["7"], "prompt_ids[0]: expected an int, got str"),
        ("abc", "prompt_ids: expected a list of ints, got str"),
        (range(3), "prompt_ids: expected a list of ints, got range"),
        (None, "prompt_ids: expected a list of ints, got NoneType"),
        (np.array([S, -1]), "prompt_ids: ids must lie in [0, 2**32)"),
        (np.array([2**32], dtype=np.uint64), "prompt_ids: ids must lie in [0, 2**32)"),
        (np.array([1.0, 2.0]), "prompt_ids: expected a 1-D integer array, got float64(2,)"),
        (np.array([True]), "prompt_ids: expected a 1-D integer array, got bool(1,)"),
        (np.array([[S, U1]]), "prompt_ids: expected a 1-D integer array, got int64(1, 2)"),
    ],
)
def test_bad_token_ids_raise_token_id_error_like_the_reference(ids, message) -> None:
    for backend in (_core, reference):
        with pytest.raises(TokenIdError) as caught:
            backend.SampleBuilder().classify(ids)
        assert str(caught.value) == message, backend.__name__


def test_token_id_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        _core.common_prefix_len([-1], [])


def test_common_prefix_len_names_its_arguments() -> None:
    with pytest.raises(TokenIdError, match=r"^b\[0\]: "):
        _core.common_prefix_len([1], [-1])


# --- logprobs in -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "logprobs",
    [[-0.5, -0.25], (-0.5, -0.25), np.array([-0.5, -0.25]), np.array([-0.5, -0.25], "f4")],
    ids=["list", "tuple", "float64", "float32"],
)
def test_logprobs_are_accepted_as_sequences_and_arrays(logprobs) -> None:
    builder = _core.SampleBuilder()
    builder.append_turn([S], [A1, A2], logprobs)
    assert builder.logprobs.tolist() == [0.0, -0.5, -0.25]


def test_empty_logprobs_mean_none() -> None:
    for logprobs in (None, [], np.array([], dtype=np.float32)):
        builder = _core.SampleBuilder()
        builder.append_turn([S], [A1, A2], logprobs)
        assert builder.logprobs.tolist() == [0.0, 0.0, 0.0]


def test_logprob_length_mismatch_raises() -> None:
    builder = _core.SampleBuilder()
    with pytest.raises(LogprobLengthError, match=r"^1 logprobs for 2 output tokens$"):
        builder.append_turn([S], [A1, A2], [-0.5])
    assert len(builder) == 0
    with pytest.raises(LogprobLengthError, match=r"^1 logprobs for 2 output tokens$"):
        _core.linearize([([S], [A1, A2], [-0.5])], [[0]])


# --- policies and settings ---------------------------------------------------------------


def test_unknown_policy_and_negative_settings_raise_policy_error() -> None:
    with pytest.raises(
        PolicyError,
        match=r"^unknown drift policy 'greedy'; expected one of \('minimal', 'slime'\)$",
    ):
        _core.SampleBuilder("greedy")
    with pytest.raises(PolicyError, match=r"^fork_threshold must be >= 0, got -1$"):
        _core.SampleBuilder("minimal", -1)
    with pytest.raises(PolicyError, match=r"^max_sample_tokens must be >= 0, got -2$"):
        one_turn().finish(-2)
    with pytest.raises(PolicyError, match="unknown drift policy"):
        _core.linearize([([S], [A1], None)], [[0]], policy="greedy")


def test_a_fork_is_refused_with_the_reference_message() -> None:
    builder = one_turn()
    with pytest.raises(
        PolicyError, match=r"^turn 7 forks from the held tokens at 1; start a new builder$"
    ):
        builder.append_turn([S, X], [B1], turn=7)
    assert builder.tokens.tolist() == HELD


def test_a_chain_naming_a_missing_turn_raises_policy_error() -> None:
    with pytest.raises(PolicyError, match=r"^chain 1 names turn 3, but there are 1 turns$"):
        _core.linearize([([S], [A1], None)], [[0], [0, 3]])
    with pytest.raises(PolicyError, match=r"^chain 0 names turn -1, but there are 1 turns$"):
        _core.linearize([([S], [A1], None)], [[0, -1]])


def test_a_wrong_type_for_a_setting_is_a_type_error() -> None:
    for backend in (_core, reference):
        with pytest.raises(TypeError):
            backend.linearize([([S], [A1], None)], [[0]], fork_threshold="8")


# --- what comes out ----------------------------------------------------------------------


def test_builder_state_comes_out_as_numpy_and_plain_python() -> None:
    builder = one_turn()
    builder.append_turn(HELD[:4] + [R3, U2], [B1], turn=1)
    assert len(builder) == 7
    assert builder.tokens.dtype == np.uint32
    assert builder.loss_mask.dtype == np.uint8
    assert builder.logprobs.dtype == np.float32
    assert builder.tokens.tolist() == [S, U1, A1, A2, R3, U2, B1]
    assert builder.loss_mask.tolist() == [0, 0, 1, 1, 0, 0, 1]
    assert builder.response_start == 2
    assert [(s.turn, s.start, s.end) for s in builder.spans] == [(0, 2, 4), (1, 6, 7)]
    assert builder.realigned == {0: 1}
    assert builder.has_trained_response()
    assert (builder.policy, builder.fork_threshold) == ("minimal", 1024)


def test_built_sample_arrays_and_counts() -> None:
    builder = one_turn()
    builder.append_turn(HELD + [U2], [B1, B2], turn=1)
    sample = builder.finish(max_sample_tokens=5)
    assert isinstance(sample.tokens, np.ndarray)
    assert sample.tokens.dtype == np.uint32
    assert sample.loss_mask.dtype == np.uint8
    assert sample.logprobs.dtype == np.float32
    assert sample.tokens.tolist() == HELD
    assert sample.loss_mask.tolist() == [1, 1, 1]
    assert sample.logprobs.tolist() == [-1.0, -2.0, -3.0]
    assert sample.response_start == 2
    assert sample.truncated is True
    assert sample.turns == [0, 1]
    assert sample.trained == {0: 3}
    assert sample.realigned == {}
    assert sample.truncated_tokens == {1: 2}
    assert sample.chain == 0
    assert sample.has_trained_response()


def test_drift_is_a_value() -> None:
    drift = one_turn().classify(HELD + [U2])
    assert drift == _core.Drift("clean", 5, 0)
    assert hash(drift) == hash(_core.Drift("clean", 5, 0))
    assert drift != _core.Drift("fork", 5, 0)
    assert repr(drift) == "Drift(kind='clean', at=5, drifted=0)"
    assert (drift.kind, drift.at, drift.drifted) == ("clean", 5, 0)


def test_classify_does_not_change_the_builder() -> None:
    builder = one_turn()
    assert builder.classify([S, X], 1) == _core.Drift("fork", 1, 4)
    assert builder.tokens.tolist() == HELD


# --- against the reference ---------------------------------------------------------------


def as_plain(lin) -> dict:
    return {
        "samples": [
            (
                s.tokens.tolist(),
                s.loss_mask.tolist(),
                s.logprobs.tolist(),
                s.response_start,
                s.truncated,
                s.turns,
                s.trained,
                s.realigned,
                s.truncated_tokens,
                s.chain,
            )
            for s in lin.samples
        ],
        "drifts": [(d.chain, d.turn, d.kind, d.at, d.drifted) for d in lin.drifts],
        "trained": lin.trained,
        "realigned": lin.realigned,
        "truncated": lin.truncated,
    }


def both(turns, chains, **settings) -> dict:
    ours = as_plain(_core.linearize(turns, chains, **settings))
    theirs = as_plain(reference.linearize(turns, chains, **settings))
    assert ours == theirs
    return ours


# Turn 0 starts the session; turn 1 extends it cleanly; turn 2 re-renders A3 as R3 (a drift
# inside turn 0's output); turn 3 starts over from a different user message (a fork).
TURNS = [
    (FIRST_PROMPT, FIRST_OUTPUT, [-1.0, -2.0, -3.0]),
    (HELD + [U2], [B1, B2], None),
    (HELD[:4] + [R3, U2], [B1], [-0.5]),
    ([S, X], [B2], []),
]


@pytest.mark.parametrize("policy", ["minimal", "slime"])
def test_realign_matches_the_reference(policy: str) -> None:
    out = both(TURNS, [[0, 2]], policy=policy)
    assert [d[2] for d in out["drifts"]] == ["realign"]
    mask = out["samples"][0][1]
    # Minimal keeps A1 A2 trained; slime drops the whole of turn 0's output.
    assert mask == ([1, 1, 0, 0, 1] if policy == "minimal" else [0, 0, 0, 0, 1])
    assert out["realigned"] == ({0: 1} if policy == "minimal" else {0: 3})


def test_fork_matches_the_reference() -> None:
    out = both(TURNS, [[0, 1, 3]])
    assert [d[2] for d in out["drifts"]] == ["clean", "fork"]
    assert [s[5] for s in out["samples"]] == [[0, 1], [3]]


def test_threshold_zero_forks_on_any_drift() -> None:
    out = both(TURNS, [[0, 2]], fork_threshold=0)
    assert [d[2] for d in out["drifts"]] == ["fork"]
    assert len(out["samples"]) == 2


def test_truncation_matches_the_reference() -> None:
    out = both(TURNS, [[0, 1]], max_sample_tokens=6)
    assert out["samples"][0][4] is True
    assert out["truncated"] == {1: 2}


def test_a_shared_turn_is_re_emitted_at_mask_zero() -> None:
    out = both(TURNS, [[0, 1], [0, 2]])
    second = out["samples"][1]
    assert second[9] == 1
    assert second[1] == [0, 0, 0, 0, 1], "turn 0 is context on its second chain"
    assert out["trained"] == {0: 3, 1: 2, 2: 1}


def test_edge_cases_match_the_reference() -> None:
    edge_turns = [
        ([], [A1], None),  # empty prompt
        ([A1], [], None),  # empty output
        ([A1], [], []),  # empty output, empty logprobs
        ([], [], None),  # nothing at all
    ]
    for chains in ([[0, 1]], [[0, 1, 2]], [[3, 0]], [[0, 3]], [[0, 0]], [[1, 2, 3]], []):
        for policy in ("minimal", "slime"):
            both(edge_turns, chains, policy=policy)
    # A prompt shorter than the held tokens, then one against the emptied span: a fork.
    shorter = [(HELD, [B1, B2], None), (HELD + [B1], [], None), (HELD + [X], [B1], None)]
    out = both(shorter, [[0, 1, 2]], policy="slime")
    assert [d[2] for d in out["drifts"]] == ["realign", "fork"]


def test_inputs_are_read_from_numpy_and_tuples() -> None:
    turns = [
        (np.array(p, dtype=np.int64), tuple(o), None if lp is None else np.array(lp))
        for p, o, lp in TURNS
    ]
    assert as_plain(_core.linearize(turns, [np.array([0, 1]), (0, 2)])) == as_plain(
        reference.linearize(TURNS, [[0, 1], [0, 2]])
    )


# --- eager validation ----------------------------------------------------------------------

GOOD = ([S], [A1], None)
BAD_IDS = ([S], [-1], None)
BAD_LOGPROBS = ([S], [A1], [-0.5, -0.25])


@pytest.mark.parametrize(
    ("turns", "chains", "settings", "error", "message"),
    [
        # Refused with nothing to linearize: every setting is checked up front.
        ([], [], {"policy": "greedy"}, PolicyError, "unknown drift policy 'greedy'"),
        ([], [], {"fork_threshold": -1}, PolicyError, "fork_threshold must be >= 0"),
        ([GOOD], [[]], {"max_sample_tokens": -1}, PolicyError, "max_sample_tokens must be >= 0"),
        # Every turn is checked, whether a chain names it or not.
        ([GOOD, BAD_IDS], [[0]], {}, TokenIdError, "output_ids[0]: id -1 is outside"),
        ([GOOD, BAD_LOGPROBS], [], {}, LogprobLengthError, "2 logprobs for 1 output tokens"),
        # The order: policy, fork_threshold, max_sample_tokens, turns by index, chains.
        (
            [BAD_IDS],
            [[5]],
            {"policy": "greedy", "fork_threshold": -1, "max_sample_tokens": -1},
            PolicyError,
            "unknown drift policy",
        ),
        (
            [BAD_IDS],
            [[5]],
            {"fork_threshold": -1, "max_sample_tokens": -1},
            PolicyError,
            "fork_threshold must",
        ),
        ([BAD_IDS], [[5]], {"max_sample_tokens": -1}, PolicyError, "max_sample_tokens must"),
        ([BAD_LOGPROBS, BAD_IDS], [[5]], {}, LogprobLengthError, "2 logprobs"),
        ([BAD_IDS, BAD_LOGPROBS], [[5]], {}, TokenIdError, "output_ids[0]"),
        ([GOOD, GOOD], [[0, 1], [0, 7], [-1]], {}, PolicyError, "chain 1 names turn 7"),
    ],
)
def test_bad_input_is_refused_before_any_work_in_the_reference_order(
    turns, chains, settings, error, message
) -> None:
    for backend in (_core, reference):
        with pytest.raises(error) as caught:
            backend.linearize(turns, chains, **settings)
        assert str(caught.value).startswith(message), backend.__name__


def test_turns_no_chain_names_still_count_for_nothing() -> None:
    out = both([GOOD, (HELD, [B1], [-0.5])], [[0]])
    assert [s[5] for s in out["samples"]] == [[0]]
    assert out["trained"] == {0: 1}
