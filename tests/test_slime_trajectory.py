"""slime's `TrajectoryManager` contract (`tests/test_agent/test_trajectory_manager_branching.py`
in THUDM/slime) against `tokentrail.integrations.slime.TrajectoryManager`, on both backends.

Tokens are small named integers, as in slime's test: a message renders as `[<role>, body,
</role>]`, a response as `[body, </ast>]` after the `<gen>` marker (the assistant's opening
token), so a replayed answer re-renders to exactly the ids that were sampled. A sample reads as
a golden string: every token by name, trained ones in brackets. slime's asserts on its tree's
private nodes (`_trees`, `MessageNode.turn`) have no counterpart; what they decide shows in the
samples, which are asserted as slime asserts them.
"""

from __future__ import annotations

from typing import Any

import pytest

from tokentrail.errors import LogprobLengthError
from tokentrail.integrations.slime import CompatSample, TrajectoryManager, TurnRecord

BANDS = {"system": 1000, "user": 2000, "assistant": 9000, "tool": 3000}
ABBR = {"system": "sys", "user": "usr", "assistant": "ast", "tool": "tul"}
GEN = BANDS["assistant"]
DRIFT = 7001
NAMES: dict[int, str] = {DRIFT: "<DRIFT>", GEN: "<gen>"}
for _role, _base in BANDS.items():
    NAMES[_base], NAMES[_base + 9] = f"<{ABBR[_role]}>", f"</{ABBR[_role]}>"
NAMES[GEN] = "<gen>"
_BODIES: dict[tuple[str, str], int] = {}


def body(role: str, label: str) -> int:
    key = (role, label)
    if key not in _BODIES:
        _BODIES[key] = BANDS[role] + 10 + sum(1 for r, _ in _BODIES if r == role)
        shown = label.replace(" ", "␣")
        NAMES[_BODIES[key]] = f"r:{shown}" if role == "assistant" else f"{role}:{shown}"
    return _BODIES[key]


class M:
    """A message and its fixed rendering."""

    def __init__(self, role: str, label: str) -> None:
        self.role, self.label = role, label
        self.message = {"role": role, "content": label}

    def ids(self) -> list[int]:
        return [BANDS[self.role], body(self.role, self.label), BANDS[self.role] + 9]


def S(x: str) -> M:
    return M("system", x)


def U(x: str) -> M:
    return M("user", x)


def A(x: str) -> M:
    return M("assistant", x)


def T(x: str) -> M:
    return M("tool", x)


def prompt(msgs: list[M]) -> list[int]:
    return [t for m in msgs for t in m.ids()] + [GEN]


def response(label: str) -> list[int]:
    return [body("assistant", label), BANDS["assistant"] + 9]


def inserted(ids: list[int], at: int) -> list[int]:
    return ids[:at] + [DRIFT] + ids[at:]


def replaced(ids: list[int], at: int) -> list[int]:
    return ids[:at] + [DRIFT] + ids[at + 1 :]


def append(
    mgr: TrajectoryManager,
    sid: str,
    msgs: list[M],
    label: str | None,
    *,
    prompt_ids: list[int] | None = None,
    finish: str = "stop",
    logprobs: list[float] | None = None,
) -> tuple[list[int], list[int]]:
    p = prompt_ids if prompt_ids is not None else prompt(msgs)
    r = response(label) if label is not None else []
    mgr.record_turn(
        sid,
        turn=TurnRecord(p, r, finish, list(logprobs) if logprobs else []),
        prompt_messages=[m.message for m in msgs],
        response_message={"role": "assistant", "content": label} if label is not None else None,
    )
    return p, r


def golden(s: Any) -> str:
    start = len(s.tokens) - s.response_length
    out = []
    for i, t in enumerate(s.tokens):
        name = NAMES.get(t, str(t))
        out.append(f"[{name}]" if i >= start and s.loss_mask[i - start] else name)
    return " ".join(out)


def traj(mgr: TrajectoryManager, sid: str, reward: float = 1.0, **kw: Any) -> list[Any]:
    samples = mgr.get_trajectory(
        sid, base_sample=CompatSample(index=0, prompt=""), reward=reward, **kw
    )
    for s in samples:
        # slime's invariants: aligned, something trained, the full reward on every sample
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
        assert sum(s.loss_mask) > 0
        assert s.reward == reward
        assert s.status is CompatSample.Status.COMPLETED
    return samples


@pytest.fixture
def mgr(backend: str):
    def make(**kw: Any) -> TrajectoryManager:
        return TrajectoryManager(backend=backend, **kw)

    return make


SU = "<sys> system:S </sys> <usr> user:u </usr>"


# -- the routing tree ---------------------------------------------------------------------------


def test_single_turn_chain(mgr) -> None:
    m = mgr()
    append(m, "1", [S("S"), U("compute")], "ok")
    assert m.turn_count("1") == 1
    assert [golden(s) for s in traj(m, "1")] == [
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> [r:ok] [</ast>]"
    ]


def test_clean_multiturn_with_tool(mgr) -> None:
    m = mgr()
    append(m, "1", [S("S"), U("u")], "call", finish="tool_calls")
    append(m, "1", [S("S"), U("u"), A("call"), T("4")], "done")
    assert m.turn_count("1") == 2
    (s,) = traj(m, "1")
    assert golden(s) == f"{SU} <gen> [r:call] [</ast>] <tul> tool:4 </tul> <gen> [r:done] [</ast>]"
    assert s.metadata["use_tool"] is False  # no tool_calls on the messages
    assert s.metadata["truncated"] is False and s.metadata["ill_formed"] is False


def test_system_user_and_assistant_forks(mgr) -> None:
    m = mgr()
    for system in ["SA", "SB"]:
        append(m, "sys", [S(system), U("u")], "a")
    assert [golden(s) for s in traj(m, "sys")] == [
        "<sys> system:SA </sys> <usr> user:u </usr> <gen> [r:a] [</ast>]",
        "<sys> system:SB </sys> <usr> user:u </usr> <gen> [r:a] [</ast>]",
    ]
    for user in ["A", "B"]:
        append(m, "usr", [S("S"), U(user)], user.lower())
    assert [golden(s) for s in traj(m, "usr")] == [
        "<sys> system:S </sys> <usr> user:A </usr> <gen> [r:a] [</ast>]",
        "<sys> system:S </sys> <usr> user:B </usr> <gen> [r:b] [</ast>]",
    ]
    append(m, "ast", [S("S"), U("u")], "a1")
    append(m, "ast", [S("S"), U("u")], "a2")
    assert [golden(s) for s in traj(m, "ast")] == [
        f"{SU} <gen> [r:a1] [</ast>]",
        f"{SU} <gen> [r:a2] [</ast>]",
    ]


def test_tool_fork_shares_the_assistant_trained_once(mgr) -> None:
    m = mgr()
    p1, r1 = append(m, "1", [S("S"), U("u")], "call", finish="tool_calls", logprobs=[-0.5] * 2)
    append(m, "1", [S("S"), U("u"), A("call"), T("x")], "ax", logprobs=[-0.4] * 2)
    p3, r3 = append(m, "1", [S("S"), U("u"), A("call"), T("y")], "ay", logprobs=[-0.3] * 2)
    samples = traj(m, "1")
    assert [golden(s) for s in samples] == [
        f"{SU} <gen> [r:call] [</ast>] <tul> tool:x </tul> <gen> [r:ax] [</ast>]",
        f"{SU} <gen> r:call </ast> <tul> tool:y </tul> <gen> [r:ay] [</ast>]",
    ]
    assert samples[1].rollout_log_probs == pytest.approx([0.0] * (len(p3) - len(p1)) + [-0.3] * 2)


def test_token_only_drift_does_not_fork_the_tree(mgr) -> None:
    m = mgr()
    pa, _ = append(m, "1", [S("S"), U("u")], "a")
    tampered = inserted(pa, 1)
    append(m, "1", [S("S"), U("u")], "b", prompt_ids=tampered)
    samples = traj(m, "1")
    assert [golden(s) for s in samples] == [
        f"{SU} <gen> [r:a] [</ast>]",
        "<sys> <DRIFT> system:S </sys> <usr> user:u </usr> <gen> [r:b] [</ast>]",
    ]
    assert DRIFT not in samples[1].tokens[len(tampered) :]


def test_multi_tool_turn(mgr) -> None:
    m = mgr()
    append(m, "1", [S("S"), U("u")], "call", finish="tool_calls")
    append(m, "1", [S("S"), U("u"), A("call"), T("A"), T("B")], "done")
    assert [golden(s) for s in traj(m, "1")] == [
        f"{SU} <gen> [r:call] [</ast>] <tul> tool:A </tul> <tul> tool:B </tul> "
        "<gen> [r:done] [</ast>]"
    ]


def test_sessions_are_isolated(mgr) -> None:
    m = mgr()
    for sid, user in [("sid-a", "A"), ("sid-b", "B")]:
        append(m, sid, [S("S"), U(user)], user.lower())
    assert [golden(s) for s in traj(m, "sid-a")] == [
        "<sys> system:S </sys> <usr> user:A </usr> <gen> [r:a] [</ast>]"
    ]
    assert [golden(s) for s in traj(m, "sid-b")] == [
        "<sys> system:S </sys> <usr> user:B </usr> <gen> [r:b] [</ast>]"
    ]


def test_empty_response_gives_no_sample(mgr) -> None:
    m = mgr()
    append(m, "1", [S("S"), U("u")], None, finish="length")
    assert m.turn_count("1") == 1
    assert traj(m, "1") == []


# -- linearization ------------------------------------------------------------------------------


def test_single_turn_logprobs_and_base_sample(mgr) -> None:
    m = mgr()
    append(m, "1", [S("S"), U("u")], "a", logprobs=[-0.5, -0.5])
    base = CompatSample(index=7, group_index=2, prompt="hi", label="L")
    (s,) = m.get_trajectory("1", base_sample=base, reward=1.0, extra_metadata={"k": 1})
    assert s.rollout_log_probs == [-0.5, -0.5]
    assert (s.index, s.group_index, s.rollout_id, s.prompt, s.label) == (7, 2, 7, "hi", "L")
    assert s.metadata["k"] == 1


def test_clean_multiturn_logprobs(mgr) -> None:
    m = mgr()
    p1, r1 = append(m, "1", [S("S"), U("u")], "call", finish="tool_calls", logprobs=[-0.5] * 2)
    p2, r2 = append(m, "1", [S("S"), U("u"), A("call"), T("4")], "done", logprobs=[-0.25] * 2)
    (s,) = traj(m, "1")
    gap = len(p2) - len(p1 + r1)
    assert s.rollout_log_probs == [-0.5] * 2 + [0.0] * gap + [-0.25] * 2


def test_drift_in_a_prompt_forks(mgr) -> None:
    m = mgr()
    p1, _ = append(m, "1", [S("S"), U("u")], "call", finish="tool_calls", logprobs=[-0.5] * 2)
    p2 = inserted(prompt([S("S"), U("u"), A("call"), T("t")]), len(p1) - 1)
    append(m, "1", [S("S"), U("u"), A("call"), T("t")], "done", prompt_ids=p2)
    assert [golden(s) for s in traj(m, "1")] == [
        f"{SU} <gen> [r:call] [</ast>]",
        f"{SU} <DRIFT> <gen> r:call </ast> <tul> tool:t </tul> <gen> [r:done] [</ast>]",
    ]


def test_short_drift_in_the_latest_response_realigns(mgr) -> None:
    m = mgr()
    p1, r1 = append(m, "1", [S("S"), U("u")], "call", finish="tool_calls", logprobs=[-0.5] * 2)
    p2 = replaced(prompt([S("S"), U("u"), A("call"), T("t")]), len(p1) + len(r1) - 1)
    append(m, "1", [S("S"), U("u"), A("call"), T("t")], "done", prompt_ids=p2, logprobs=[-0.25] * 2)
    (s,) = traj(m, "1")
    assert golden(s) == f"{SU} <gen> r:call <DRIFT> <tul> tool:t </tul> <gen> [r:done] [</ast>]"
    assert s.rollout_log_probs == [0.0] * (len(p2) - len(p1)) + [-0.25] * 2


@pytest.mark.parametrize("threshold", [1, 0])
def test_drift_forks_at_or_over_the_threshold(mgr, threshold: int) -> None:
    m = mgr(fork_threshold_tokens=threshold)
    p1, r1 = append(m, "1", [S("S"), U("u")], "call", finish="tool_calls")
    p2 = replaced(prompt([S("S"), U("u"), A("call"), T("t")]), len(p1) + len(r1) - 1)
    append(m, "1", [S("S"), U("u"), A("call"), T("t")], "done", prompt_ids=p2)
    assert [golden(s) for s in traj(m, "1")] == [
        f"{SU} <gen> [r:call] [</ast>]",
        f"{SU} <gen> r:call <DRIFT> <tul> tool:t </tul> <gen> [r:done] [</ast>]",
    ]


def test_drift_in_an_earlier_response_forks(mgr) -> None:
    m = mgr()
    p1, r1 = append(m, "1", [S("S"), U("u")], "a1", finish="tool_calls")
    append(m, "1", [S("S"), U("u"), A("a1"), T("t1")], "a2", finish="tool_calls")
    msgs = [S("S"), U("u"), A("a1"), T("t1"), A("a2"), T("t2")]
    append(m, "1", msgs, "a3", prompt_ids=replaced(prompt(msgs), len(p1) + len(r1) - 1))
    assert [golden(s) for s in traj(m, "1")] == [
        f"{SU} <gen> [r:a1] [</ast>] <tul> tool:t1 </tul> <gen> [r:a2] [</ast>]",
        f"{SU} <gen> r:a1 <DRIFT> <tul> tool:t1 </tul> <gen> r:a2 </ast> <tul> tool:t2 </tul> "
        "<gen> [r:a3] [</ast>]",
    ]


def test_foreign_assistant_routes_only(mgr) -> None:
    m = mgr()
    append(m, "1", [S("S"), U("u")], "a1", finish="tool_calls")
    append(m, "1", [S("S"), U("u"), A("a1"), T("t1")], "a2", finish="tool_calls")
    msgs = [S("S"), U("u"), A("a1"), T("t1"), A("a2"), A("foreign"), T("t2")]
    append(m, "1", msgs, "a3")
    assert [golden(s) for s in traj(m, "1")] == [
        f"{SU} <gen> [r:a1] [</ast>] <tul> tool:t1 </tul> <gen> [r:a2] [</ast>] "
        "<gen> r:foreign </ast> <tul> tool:t2 </tul> <gen> [r:a3] [</ast>]"
    ]


def test_get_trajectory_consumes_and_drop_clears(mgr) -> None:
    m = mgr()
    append(m, "1", [S("S"), U("u")], "a")
    assert m.has_session("1")
    assert len(traj(m, "1")) == 1
    assert not m.has_session("1") and traj(m, "1") == []
    append(m, "2", [S("S"), U("u")], "a")
    m.drop_session("2")
    assert not m.has_session("2") and traj(m, "2") == []


def test_max_sample_tokens_cuts_the_sample(mgr) -> None:
    m = mgr()
    p, r = append(m, "1", [S("S"), U("u")], "ok")
    samples = traj(m, "1", max_sample_tokens=len(p) + 1)
    assert [s.tokens for s in samples] == [p + r[:1]]


# -- rewrites and combinations ------------------------------------------------------------------


def test_short_rewrite_is_merged(mgr) -> None:
    m = mgr()
    append(m, "1", [S("S"), U("u")], "ok", finish="tool_calls")
    append(m, "1", [S("S"), U("u"), A("ok "), T("t")], "done")
    # later turns replaying the rewrite descend through the merged node
    append(m, "1", [S("S"), U("u"), A("ok "), T("t"), A("done"), T("t2")], "third")
    assert [golden(s) for s in traj(m, "1")] == [
        f"{SU} <gen> r:ok␣ </ast> <tul> tool:t </tul> <gen> [r:done] [</ast>] "
        "<tul> tool:t2 </tul> <gen> [r:third] [</ast>]"
    ]


@pytest.mark.parametrize("threshold", [1, 0])
def test_long_rewrite_or_merging_off_forks(mgr, threshold: int) -> None:
    m = mgr(fork_threshold_tokens=threshold)
    append(m, "1", [S("S"), U("u")], "ok", finish="tool_calls")
    append(m, "1", [S("S"), U("u"), A("ok2 "), T("t")], "done")
    assert [golden(s) for s in traj(m, "1")] == [
        f"{SU} <gen> [r:ok] [</ast>]",
        f"{SU} <gen> r:ok2␣ </ast> <tul> tool:t </tul> <gen> [r:done] [</ast>]",
    ]


def test_ambiguous_rewrite_forks(mgr) -> None:
    m = mgr()
    append(m, "1", [S("S"), U("u")], "a")
    append(m, "1", [S("S"), U("u")], "b")
    append(m, "1", [S("S"), U("u"), A("c"), T("t")], "d")
    assert [golden(s) for s in traj(m, "1")] == [
        f"{SU} <gen> [r:a] [</ast>]",
        f"{SU} <gen> [r:b] [</ast>]",
        f"{SU} <gen> r:c </ast> <tul> tool:t </tul> <gen> [r:d] [</ast>]",
    ]


def test_tree_fork_with_token_drift(mgr) -> None:
    m = mgr()
    p1, _ = append(m, "1", [S("S"), U("u")], "call", finish="tool_calls")
    append(m, "1", [S("S"), U("u"), A("call"), T("x")], "ax2", finish="tool_calls")
    msgs = [S("S"), U("u"), A("call"), T("x"), A("ax2"), T("xx")]
    append(m, "1", msgs, "ax3", prompt_ids=inserted(prompt(msgs), len(p1) - 1))
    append(m, "1", [S("S"), U("u"), A("call"), T("y")], "ay2")
    assert [golden(s) for s in traj(m, "1")] == [
        f"{SU} <gen> [r:call] [</ast>] <tul> tool:x </tul> <gen> [r:ax2] [</ast>]",
        f"{SU} <DRIFT> <gen> r:call </ast> <tul> tool:x </tul> <gen> r:ax2 </ast> "
        "<tul> tool:xx </tul> <gen> [r:ax3] [</ast>]",
        f"{SU} <gen> r:call </ast> <tul> tool:y </tul> <gen> [r:ay2] [</ast>]",
    ]


def test_deep_shared_prefix_trains_once(mgr) -> None:
    m = mgr()
    append(m, "1", [S("S"), U("u")], "a1", finish="tool_calls")
    append(m, "1", [S("S"), U("u"), A("a1"), T("t1")], "a2", finish="tool_calls")
    for x in "pqr":
        append(m, "1", [S("S"), U("u"), A("a1"), T("t1"), A("a2"), T(x)], f"end-{x}")
    head = f"{SU} <gen> r:a1 </ast> <tul> tool:t1 </tul> <gen> r:a2 </ast>"
    assert [golden(s) for s in traj(m, "1")] == [
        f"{SU} <gen> [r:a1] [</ast>] <tul> tool:t1 </tul> <gen> [r:a2] [</ast>] "
        "<tul> tool:p </tul> <gen> [r:end-p] [</ast>]",
        f"{head} <tul> tool:q </tul> <gen> [r:end-q] [</ast>]",
        f"{head} <tul> tool:r </tul> <gen> [r:end-r] [</ast>]",
    ]


def test_long_mixed_session(mgr) -> None:
    m = mgr()
    lp = [-0.5, -0.5]
    p1, _ = append(m, "1", [S("S"), U("u")], "a0", finish="tool_calls", logprobs=lp)
    msgs = [S("S"), U("u"), A("a0"), T("t0")]
    append(m, "1", msgs, "a1", finish="tool_calls", logprobs=lp)
    msgs += [A("a1"), T("t1")]
    append(m, "1", msgs, "a2", finish="tool_calls", logprobs=lp)
    msgs += [A("a2"), T("t2")]
    p = prompt(msgs)
    append(m, "1", msgs, "a3", prompt_ids=replaced(p, len(p) - 2), finish="tool_calls", logprobs=lp)
    msgs += [A("a3"), T("t3")]
    append(m, "1", msgs, "a4", finish="tool_calls", logprobs=lp)
    msgs += [A("a4"), T("t4")]
    append(m, "1", msgs, "a5", prompt_ids=inserted(prompt(msgs), len(p1) - 1), logprobs=lp)
    context = (
        "<gen> r:a0 </ast> <tul> tool:t0 </tul> <gen> r:a1 </ast> <tul> tool:t1 </tul> "
        "<gen> r:a2 </ast> <tul> tool:t2 </tul> <gen> r:a3 </ast> <tul> tool:t3 </tul>"
    )
    assert [golden(s) for s in traj(m, "1")] == [
        f"{SU} <gen> [r:a0] [</ast>] <tul> tool:t0 </tul> <gen> [r:a1] [</ast>] "
        "<tul> tool:t1 </tul> <gen> [r:a2] [</ast>] <tul> tool:t2 <DRIFT> <gen> [r:a3] [</ast>]",
        f"{SU} {context} <gen> [r:a4] [</ast>]",
        f"{SU} <DRIFT> {context} <gen> r:a4 </ast> <tul> tool:t4 </tul> <gen> [r:a5] [</ast>]",
    ]


# -- edges --------------------------------------------------------------------------------------


def test_logprobs_length_mismatch_raises(mgr) -> None:
    """slime asserts (AssertionError); tokentrail raises its named error, a ValueError."""
    m = mgr()
    bad = TurnRecord(prompt([S("S"), U("u")]), [9101, 9102, 9103], "stop", [-0.1, -0.2])
    with pytest.raises(LogprobLengthError, match="log"):
        m.record_turn("1", turn=bad, prompt_messages=[S("S").message], response_message=None)
    assert m.turn_count("1") == 0


def test_empty_prompt_messages_are_skipped(mgr) -> None:
    m = mgr()
    assert (
        m.record_turn(
            "1", turn=TurnRecord([1], [2], "stop"), prompt_messages=[], response_message=None
        )
        is None
    )
    assert m.turn_count("1") == 0 and not m.has_session("1")


def test_base_sample_is_required(mgr) -> None:
    m = mgr()
    append(m, "1", [S("S"), U("u")], "a")
    with pytest.raises(TypeError):
        m.get_trajectory("1", reward=1.0)  # type: ignore[call-arg]


def test_logprobs_missing_on_one_turn_are_zero(mgr) -> None:
    m = mgr()
    p1, r1 = append(m, "1", [S("S"), U("u")], "call", finish="tool_calls", logprobs=[-0.5] * 2)
    p2, _ = append(m, "1", [S("S"), U("u"), A("call"), T("t")], "done")
    (s,) = traj(m, "1")
    assert s.rollout_log_probs == [-0.5] * 2 + [0.0] * (len(p2) - len(p1 + r1)) + [0.0] * 2
    assert sum(s.loss_mask) == 4


@pytest.mark.parametrize(("threshold", "forks"), [(2, True), (3, False)])
def test_realign_gate_is_the_incoming_output_length(mgr, threshold: int, forks: bool) -> None:
    m = mgr(fork_threshold_tokens=threshold)
    p1, r1 = prompt([S("S"), U("u")]), [9001, 9002, 9003, 9004]
    m.record_turn(
        "1",
        turn=TurnRecord(p1, r1, "tool_calls"),
        prompt_messages=[S("S").message, U("u").message],
        response_message={"role": "assistant", "content": "a1"},
    )
    p2 = replaced(p1 + r1 + T("t").ids() + [GEN], len(p1) + len(r1) - 1)
    r2 = [9100, 9101]
    m.record_turn(
        "1",
        turn=TurnRecord(p2, r2, "stop"),
        prompt_messages=[
            S("S").message,
            U("u").message,
            {"role": "assistant", "content": "a1"},
            T("t").message,
        ],
        response_message={"role": "assistant", "content": "done"},
    )
    samples = traj(m, "1")
    if forks:
        assert [(s.tokens, s.loss_mask) for s in samples] == [(p1 + r1, [1] * 4), (p2 + r2, [1, 1])]
    else:
        assert [(s.tokens, s.loss_mask) for s in samples] == [
            (p2 + r2, [0] * (len(p2) - len(p1)) + [1, 1])
        ]


def test_tokentrails_own_policies_are_one_argument_away(mgr) -> None:
    """drift_policy="minimal" keeps a drifted response's tokens up to the divergence trained;
    slime's masks the whole span. And every sample carries its turns' ledger entries."""
    runs = {}
    for policy in ("slime", "minimal"):
        m = mgr(drift_policy=policy)
        p1, r1 = prompt([S("S"), U("u")]), [9001, 9002, 9003, 9004]
        m.record_turn(
            "1",
            turn=TurnRecord(p1, r1, "tool_calls"),
            prompt_messages=[S("S").message, U("u").message],
            response_message={"role": "assistant", "content": "a1"},
        )
        p2 = replaced(p1 + r1 + T("t").ids() + [GEN], len(p1) + len(r1) - 1)
        m.record_turn(
            "1",
            turn=TurnRecord(p2, [9100], "stop"),
            prompt_messages=[
                S("S").message,
                U("u").message,
                {"role": "assistant", "content": "a1"},
                T("t").message,
            ],
            response_message={"role": "assistant", "content": "done"},
        )
        (s,) = traj(m, "1")
        runs[policy] = sum(s.loss_mask), s.metadata["ledger"]
    assert runs["slime"][0] == 1  # the drifted response masked whole
    assert runs["minimal"][0] == 4  # three of its four tokens kept
    assert [e["trained"] for e in runs["slime"][1]] == [0, 1]
    assert [e["masked"] for e in runs["slime"][1]] == [{"realigned": 4}, {}]
