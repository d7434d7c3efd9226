"""The Rust `TurnStore` and the reference's hold the same turns and linearize them alike.

Random turn trees (prompts that continue an earlier turn's tokens with a tail, sometimes with a
drifted id or cut short; empty outputs; absent, empty and present logprobs) go into both
stores: every accessor agrees, and each store's `linearize` equals the module-level `linearize`
of its materialized turns. Bad input raises the same named error with the same message.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from test_differential import as_plain
from tokentrail import _core
from tokentrail.core import reference
from tokentrail.core.backend import load_backend
from tokentrail.errors import LogprobLengthError, PolicyError, TokenIdError

BACKENDS = (_core, reference)

# Named tokens: system S, users U1 U2, assistant outputs A1 A2 (turn 0) and B1 (turn 1), a
# re-rendering R2 of A2, and a stray X.
S, U1, U2 = 100, 201, 202
A1, A2, B1 = 301, 302, 311
R2 = 333
X = 999

token = st.integers(0, 40)

# One pushed turn: (parent or -1, prompt, output, logprobs as passed).
Pushed = tuple[int, list[int], list[int], list[float] | None]


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[Pushed], list[list[int]]]:
    """A random tree of turns, and a chain from the root to every leaf."""
    n = draw(st.integers(1, 10))
    pushed: list[Pushed] = []
    full: list[list[int]] = []
    for t in range(n):
        parent = draw(st.sampled_from([-1, *range(t), *([t - 1] * 3 if t else [])]))
        prompt = (full[parent] if parent >= 0 else []) + draw(st.lists(token, max_size=6))
        edit = draw(st.sampled_from(["none", "none", "drift", "cut"]))
        if edit == "drift" and prompt:
            prompt[draw(st.integers(0, len(prompt) - 1))] = draw(token)
        elif edit == "cut" and prompt:
            prompt = prompt[: draw(st.integers(0, len(prompt)))]
        output = draw(st.lists(token, max_size=5))
        logprobs = draw(
            st.one_of(
                st.none(),
                st.just([]),
                st.lists(st.floats(-20, 0, width=32), min_size=len(output), max_size=len(output)),
            )
        )
        pushed.append((parent, prompt, output, logprobs))
        full.append(prompt + output)
    parents = [p for p, *_ in pushed]
    chains = []
    for leaf in (t for t in range(n) if t not in parents):
        chain, at = [], leaf
        while at >= 0:
            chain.append(at)
            at = parents[at]
        chains.append(chain[::-1])
    return pushed, chains


def filled(backend, pushed: list[Pushed]):
    store = backend.TurnStore()
    for t, (parent, prompt, output, logprobs) in enumerate(pushed):
        assert store.push(parent, prompt, output, logprobs) == t
    return store


def contents(store) -> list:
    """Everything a store tells about its turns, as plain Python values and dtypes."""
    out: list = [len(store), store.nbytes()]
    for t in range(len(store)):
        lps = store.logprobs(t)
        arrays = [store.prompt_ids(t), store.output_ids(t), store.tokens(t)]
        out.append(
            (
                [(a.tolist(), a.dtype.str) for a in arrays],
                None if lps is None else (lps.tolist(), lps.dtype.str),
                store.output_len(t),
            )
        )
    return out


def materialized(store) -> list:
    return [
        (store.prompt_ids(t), store.output_ids(t), store.logprobs(t)) for t in range(len(store))
    ]


@given(tree=sessions())
def test_both_stores_hold_the_same_turns(tree) -> None:
    pushed, _ = tree
    rust, py = filled(_core, pushed), filled(reference, pushed)
    assert contents(rust) == contents(py)
    for t, (_, prompt, output, logprobs) in enumerate(pushed):
        assert rust.prompt_ids(t).tolist() == prompt
        assert rust.tokens(t).tolist() == prompt + output
        assert (rust.logprobs(t) is None) == (not logprobs)
    assert rust.heap_bytes() >= rust.nbytes() == py.heap_bytes()


@given(
    tree=sessions(),
    extra=st.lists(st.integers(0, 9), max_size=6),
    policy=st.sampled_from(["minimal", "slime"]),
    threshold=st.sampled_from([0, 1, 3, 1024]),
    max_tokens=st.sampled_from([0, 0, 5, 17]),
)
def test_store_linearize_agrees(tree, extra, policy: str, threshold: int, max_tokens: int) -> None:
    pushed, chains = tree
    # Also a chain that jumps around the tree and revisits turns.
    chains = [*chains, [t for t in extra if t < len(pushed)]]
    kwargs = dict(policy=policy, fork_threshold=threshold, max_sample_tokens=max_tokens)
    results = []
    for backend in BACKENDS:
        store = filled(backend, pushed)
        got = as_plain(store.linearize(chains, **kwargs))
        assert got == as_plain(backend.linearize(materialized(store), chains, **kwargs))
        results.append(got)
    assert results[0] == results[1]


def test_a_prompt_is_stored_as_the_shared_prefix_and_a_tail(backend: str) -> None:
    store = load_backend(backend).TurnStore()
    assert len(store) == 0 and store.nbytes() == 0
    store.push(-1, [S, U1], [A1, A2], [-1.0, -2.0])
    store.push(0, np.array([S, U1, A1, A2, U2], dtype=np.uint32), [B1])
    store.push(0, np.array([S, U1, A1, R2, U2], dtype=np.int64), (B1,), [])
    # Tails [S U1] [U2] [R2 U2], outputs [A1 A2] [B1] [B1], two logprobs, three turns.
    assert store.nbytes() == 4 * (5 + 4) + 4 * 2 + 8 * 3
    assert store.tokens(2).tolist() == [S, U1, A1, R2, U2, B1]
    assert store.prompt_ids(1).tolist() == [S, U1, A1, A2, U2]
    assert store.tokens(1).dtype == np.uint32
    assert store.logprobs(0).tolist() == [-1.0, -2.0]
    assert store.logprobs(0).dtype == np.float32
    assert store.logprobs(1) is None and store.logprobs(2) is None
    assert store.output_len(2) == 1


def test_memory_grows_with_the_unique_tokens(backend: str) -> None:
    store = load_backend(backend).TurnStore()
    context: list[int] = []
    for t in range(100):
        context += range(1000 + 10 * t, 1010 + 10 * t)
        store.push(t - 1, context, [])
    # 1000 tail ids, not the 50,500 ids of every prompt in full.
    assert store.nbytes() == 4 * 1000 + 8 * 100
    assert store.heap_bytes() < 40_000
    assert store.tokens(99).tolist() == context


def test_the_returned_tokens_are_a_copy(backend: str) -> None:
    store = load_backend(backend).TurnStore()
    store.push(-1, [S, U1], [A1])
    store.tokens(0)[0] = X
    assert store.tokens(0).tolist() == [S, U1, A1]


# --- bad input ---------------------------------------------------------------------------------


def two_turns(backend):
    store = backend.TurnStore()
    store.push(-1, [S, U1], [A1, A2])
    store.push(0, [S, U1, A1, A2, U2], [B1])
    return store


def missing(turn: int) -> str:
    return f"turn {turn} does not exist (2 turns stored)"


POLICY = "unknown drift policy 'greedy'; expected one of ('minimal', 'slime')"
LOGPROBS = "2 logprobs for 1 output tokens"

# (method, args, kwargs, error, message) on a store of two turns.
BAD_INPUT = [
    ("push", (2, [S], [A1]), {}, PolicyError, "parent " + missing(2)),
    ("push", (-2, [S], [A1]), {}, PolicyError, "parent " + missing(-2)),
    ("push", (0, [S, -1], [A1]), {}, TokenIdError, "prompt_ids[1]: id -1 is outside [0, 2**32)"),
    ("push", (0, [S], ["a"]), {}, TokenIdError, "output_ids[0]: expected an int, got str"),
    ("push", (0, [S], [True]), {}, TokenIdError, "output_ids[0]: expected an int, got bool"),
    (
        "push",
        (0, np.array([1.0]), [A1]),
        {},
        TokenIdError,
        "prompt_ids: expected a 1-D integer array, got float64(1,)",
    ),
    ("push", (0, [S], [A1], [-1.0, -2.0]), {}, LogprobLengthError, LOGPROBS),
    # The ids, then the logprobs, then the parent.
    ("push", (7, [S], [A1], [-1.0, -2.0]), {}, LogprobLengthError, LOGPROBS),
    (
        "push",
        (7, [S], [-3], [-1.0]),
        {},
        TokenIdError,
        "output_ids[0]: id -3 is outside [0, 2**32)",
    ),
    ("prompt_ids", (2,), {}, PolicyError, missing(2)),
    ("tokens", (-1,), {}, PolicyError, missing(-1)),
    ("output_ids", (5,), {}, PolicyError, missing(5)),
    ("logprobs", (-3,), {}, PolicyError, missing(-3)),
    ("output_len", (2,), {}, PolicyError, missing(2)),
    (
        "linearize",
        ([[0, 1], [0, 2]],),
        {},
        PolicyError,
        "chain 1 names turn 2, but there are 2 turns",
    ),
    ("linearize", ([[-1]],), {}, PolicyError, "chain 0 names turn -1, but there are 2 turns"),
    # The policy, then fork_threshold, then max_sample_tokens, then the chains.
    ("linearize", ([[9]],), dict(policy="greedy", fork_threshold=-1), PolicyError, POLICY),
    (
        "linearize",
        ([[9]],),
        dict(fork_threshold=-1, max_sample_tokens=-2),
        PolicyError,
        "fork_threshold must be >= 0, got -1",
    ),
    (
        "linearize",
        ([[9]],),
        dict(max_sample_tokens=-2),
        PolicyError,
        "max_sample_tokens must be >= 0, got -2",
    ),
]


@pytest.mark.parametrize(("method", "args", "kwargs", "error", "message"), BAD_INPUT)
def test_bad_input_raises_the_named_error_on_both_backends(
    method: str, args: tuple, kwargs: dict, error: type, message: str
) -> None:
    for backend in BACKENDS:
        store = two_turns(backend)
        with pytest.raises(ValueError) as caught:
            getattr(store, method)(*args, **kwargs)
        assert (type(caught.value), str(caught.value)) == (error, message), backend.__name__
        assert len(store) == 2, "a refused push stores nothing"


def test_an_empty_store_has_no_turn_minus_one(backend: str) -> None:
    store = load_backend(backend).TurnStore()
    with pytest.raises(PolicyError, match=r"^turn -1 does not exist \(0 turns stored\)$"):
        store.tokens(-1)
