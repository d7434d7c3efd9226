"""The Rust core and the pure-Python reference agree, sample for sample and token for token.

Random turn trees with injected drift, forks, truncated prompts, empty outputs and mixed
logprobs go through both backends' `linearize`, random sessions through two managers, and
random edits of a session's prompt through both incremental tokenizers.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tokens import assistant, play, prompt_ids, system, tool, user
from tokentrail import TrajectoryManager, _core
from tokentrail.core import reference
from tokentrail.text.tokenizer import load_tokenizer

token = st.integers(0, 40)


@st.composite
def turn_trees(draw: st.DrawFn) -> tuple[list, list[list[int]]]:
    n = draw(st.integers(1, 9))
    turns: list = []
    parents: list[int | None] = []
    for t in range(n):
        parent = draw(st.sampled_from([None, *range(t)]))
        base = [] if parent is None else turns[parent][0] + turns[parent][1]
        prompt = base + draw(st.lists(token, max_size=6))
        edit = draw(st.sampled_from(["none", "none", "drift", "cut"]))
        if edit == "drift" and prompt:
            pos = draw(st.integers(0, len(prompt) - 1))
            prompt[pos] = draw(token)
        elif edit == "cut" and prompt:
            prompt = prompt[: draw(st.integers(0, len(prompt)))]
        output = draw(st.lists(token, max_size=8))
        logprobs = draw(
            st.one_of(
                st.none(),
                st.just([]),
                st.lists(st.floats(-20, 0, width=32), min_size=len(output), max_size=len(output)),
            )
        )
        turns.append((prompt, output, logprobs))
        parents.append(parent)
    chains = []
    for leaf in (t for t in range(n) if t not in parents):
        chain, cur = [], leaf
        while cur is not None:
            chain.append(cur)
            cur = parents[cur]
        chains.append(chain[::-1])
    return turns, chains


def as_plain(lin) -> dict:
    return {
        "samples": [
            (
                s.tokens.tolist(),
                s.loss_mask.tolist(),
                s.logprobs.tolist(),
                s.tokens.dtype.str,
                s.loss_mask.dtype.str,
                s.logprobs.dtype.str,
                s.response_start,
                bool(s.truncated),
                list(s.turns),
                [(span.turn, span.start, span.end) for span in s.spans],
                dict(s.trained),
                dict(s.realigned),
                dict(s.truncated_tokens),
                s.chain,
            )
            for s in lin.samples
        ],
        "drifts": [(d.chain, d.turn, d.kind, d.at, d.drifted) for d in lin.drifts],
        "trained": dict(lin.trained),
        "realigned": dict(lin.realigned),
        "truncated": dict(lin.truncated),
    }


@given(
    tree=turn_trees(),
    policy=st.sampled_from(["minimal", "slime"]),
    threshold=st.sampled_from([0, 1, 3, 8, 1024]),
    max_tokens=st.sampled_from([0, 0, 5, 17, 40]),
)
def test_linearize_agrees(tree, policy: str, threshold: int, max_tokens: int) -> None:
    turns, chains = tree
    kwargs = dict(policy=policy, fork_threshold=threshold, max_sample_tokens=max_tokens)
    rust = _core.linearize(turns, chains, **kwargs)
    py = reference.linearize(turns, chains, **kwargs)
    assert as_plain(rust) == as_plain(py)


@given(
    a=st.lists(st.integers(0, 3), max_size=40),
    b=st.lists(st.integers(0, 3), max_size=40),
)
def test_common_prefix_len_agrees(a: list[int], b: list[int]) -> None:
    expected = reference.common_prefix_len(a, b)
    assert _core.common_prefix_len(a, b) == expected
    assert _core.common_prefix_len(np.array(a, np.uint32), np.array(b, np.int64)) == expected


MESSAGES = [system("s"), user("do it"), user("do that"), tool("ok"), tool("fail")]


@st.composite
def sessions(draw: st.DrawFn) -> list[tuple[list[dict], dict, list[int] | None]]:
    """A random session: each turn extends an earlier conversation or starts a new one."""
    convos: list[list[dict]] = []
    turns = []
    for k in range(draw(st.integers(1, 10))):
        if convos and draw(st.booleans()):
            history = list(draw(st.sampled_from(convos)))
        else:
            history = [draw(st.sampled_from(MESSAGES[:3]))]
        reply = draw(
            st.sampled_from(
                [
                    assistant(f"r{k}"),
                    assistant("", ("Edit", {"f": k})),
                    assistant("x" * draw(st.integers(0, 30))),
                ]
            )
        )
        prompt = None
        if draw(st.booleans()):
            prompt = prompt_ids(history)
            pos = draw(st.integers(0, len(prompt) - 1))
            prompt[pos] = 7
        turns.append((history, reply, prompt))
        convos.append([*history, reply, draw(st.sampled_from(MESSAGES[1:]))])
        if draw(st.booleans()):  # a rewritten copy of the reply
            convos.append([*history, assistant(f"rewritten {k}"), user("next")])
    return turns


@given(
    session=sessions(),
    policy=st.sampled_from(["minimal", "slime"]),
    threshold=st.sampled_from([0, 4, 1024]),
    max_tokens=st.sampled_from([0, 30]),
)
def test_managers_agree(session, policy: str, threshold: int, max_tokens: int) -> None:
    results = []
    for backend in ("rust", "python"):
        mgr = TrajectoryManager(
            backend=backend, drift_policy=policy, fork_threshold_tokens=threshold
        )
        for history, reply, prompt in session:
            play(mgr, "s", history, reply, prompt=prompt)
        traj = mgr.finish("s", reward=1.0, max_sample_tokens=max_tokens)
        ledger = traj.ledger.to_dict()
        for t in ledger["turns"]:
            assert t["trained"] + sum(t["masked"].values()) == t["generated"]
        results.append(([s.to_dict() for s in traj.samples], ledger, traj.drifts))
    assert results[0] == results[1]


@functools.cache
def tokenizers() -> tuple[_core.IncrementalTokenizer, reference.IncrementalTokenizer]:
    """Both backends' incremental tokenizers over the real Qwen3 vocabulary, loaded once."""
    config = load_tokenizer().tokenizer.to_str()
    return _core.IncrementalTokenizer(config), reference.IncrementalTokenizer(config)


_sessions = itertools.count()
# Added tokens and their near misses, next to text of every width: where a prompt may resume.
prompt_pieces = st.one_of(
    st.sampled_from(["<|im_start|>", "<|im_end|>", "<think>", "<|im_end", "|>", "user\n"]),
    st.text(alphabet=" \n\t<|>/_aé汉🦀\u0301", max_size=10),
)
prompts = st.lists(prompt_pieces, max_size=10).map("".join)


@given(
    first=prompts,
    edits=st.lists(st.tuples(st.integers(0, 200), prompts), min_size=1, max_size=6),
)
def test_incremental_tokenizers_agree(first: str, edits: list[tuple[int, str]]) -> None:
    """Each prompt of a session is the previous one cut somewhere with new text after it: both
    tokenizers give the same ids, and reuse and encode the same amounts, forks included."""
    rust, py = (t.fork() for t in tokenizers())
    session = f"s{next(_sessions)}"
    text = first
    for cut, tail in [(len(first), ""), *edits]:
        text = text[:cut] + tail
        ids = rust.encode(session, text)
        assert ids.dtype == np.uint32
        assert ids.tolist() == py.encode(session, text).tolist()
        assert rust.encode_full(text).tolist() == ids.tolist()
        assert (rust.reused_ids(), rust.encoded_bytes()) == (py.reused_ids(), py.encoded_bytes())
    assert rust.sessions() == py.sessions() == 1
    assert (rust.safe, rust.fallback_reason) == (py.safe, py.fallback_reason)
    rust.forget(session)
    py.forget(session)
    assert rust.sessions() == py.sessions() == 0
