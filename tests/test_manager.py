"""The routing tree and its linearization, on readable token fixtures, for both backends."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokens import (
    END,
    LOGPROB,
    START,
    assistant,
    play,
    prompt_ids,
    render,
    sampled,
    system,
    tool,
    user,
)
from tokentrail import (
    LogprobLengthError,
    MessageError,
    PolicyError,
    TokenIdError,
    TrajectoryManager,
    TurnRecord,
)
from tokentrail.sim.debug import format_sample, format_tree


@pytest.fixture
def mgr(backend: str) -> TrajectoryManager:
    return TrajectoryManager(backend=backend)


def trained_span(sample, output: list[int]) -> bool:
    """True when `output` appears in the sample's response with mask 1 throughout."""
    resp = sample.tokens[sample.prompt_length :].tolist()
    mask = sample.loss_mask.tolist()
    for i in range(len(resp) - len(output) + 1):
        if resp[i : i + len(output)] == output:
            return all(mask[i : i + len(output)])
    return False


def assert_ledger_sums(ledger) -> None:
    for t in ledger.turns:
        assert t.trained + sum(t.masked.values()) == t.generated, t
        assert "unaccounted" not in t.masked
    assert ledger.trained_tokens + sum(ledger.masked_tokens.values()) == ledger.generated_tokens


SYS = system("be brief")
U1 = user("fix it")
A1 = assistant("look", ("Read", {"path": "a.py"}))
T1 = tool("x=1")
A2 = assistant("done")


def test_single_turn_chain(mgr: TrajectoryManager) -> None:
    out = play(mgr, "s", [SYS, U1], A1)
    traj = mgr.finish("s", reward=1.0)
    (s,) = traj.samples
    prompt = prompt_ids([SYS, U1])
    assert s.tokens.tolist() == prompt + out
    assert s.response_length == len(out)
    assert s.loss_mask.tolist() == [1] * len(out)
    assert np.allclose(s.rollout_log_probs, LOGPROB)
    assert s.tokens.dtype == np.uint32 and s.loss_mask.dtype == np.uint8
    assert s.metadata["use_tool"] is True and s.metadata["truncated"] is False
    assert traj.ledger.to_dict()["trained_tokens"] == len(out)


def test_clean_multi_turn_with_tools_is_one_sample(mgr: TrajectoryManager) -> None:
    out1 = play(mgr, "s", [SYS, U1], A1)
    out2 = play(mgr, "s", [SYS, U1, A1, T1], A2)
    traj = mgr.finish("s")
    (s,) = traj.samples
    tool_ids = render(T1) + [START, 300]
    assert s.tokens[s.prompt_length :].tolist() == out1 + tool_ids + out2
    assert s.loss_mask.tolist() == [1] * len(out1) + [0] * len(tool_ids) + [1] * len(out2)
    assert traj.drift_counts == {"clean": 1}
    assert traj.ledger.trained_tokens == len(out1) + len(out2)
    assert_ledger_sums(traj.ledger)


@pytest.mark.parametrize("at", ["system", "user", "assistant", "tool"])
def test_forks_at_each_role_train_the_shared_turn_once(mgr: TrajectoryManager, at: str) -> None:
    play(mgr, "s", [SYS, U1], A1)
    play(mgr, "s", [SYS, U1, A1, T1], A2)
    variant = {
        "system": [system("be verbose"), U1],
        "user": [SYS, user("fix that")],
        "assistant": [SYS, U1, assistant("a different call", ("Read", {"path": "b.py"}))],
        "tool": [SYS, U1, A1, tool("x=2")],
    }[at]
    reply = assistant("other")
    play(mgr, "s", variant, reply)
    traj = mgr.finish("s")
    assert len(traj.samples) == 2
    first, second = traj.samples
    out1 = sampled(A1)
    assert trained_span(first, out1)
    if at in ("assistant", "tool"):
        # The second leaf's prompt starts with turn 1's exchange: re-emitted as context, not
        # trained twice; at an assistant fork it is only the prompt prefix.
        assert not trained_span(second, out1)
    assert trained_span(second, sampled(reply))
    assert traj.ledger.trained_tokens == traj.ledger.generated_tokens
    assert_ledger_sums(traj.ledger)


def test_token_only_drift_realigns_within_the_last_response(mgr: TrajectoryManager) -> None:
    out1 = play(mgr, "s", [SYS, U1], A1)
    # The harness's re-render tokenizes the tail of turn 1 differently: 3 ids drift.
    prompt2 = prompt_ids([SYS, U1, A1, T1])
    drift_at = len(prompt_ids([SYS, U1])) + len(out1) - 3
    prompt2[drift_at : drift_at + 2] = [999, 998]
    out2 = play(mgr, "s", [SYS, U1, A1, T1], A2, prompt=prompt2)
    traj = mgr.finish("s")
    (s,) = traj.samples
    assert s.tokens.tolist() == prompt2 + out2
    assert traj.drift_counts == {"realign": 1}
    (d,) = traj.drifts
    assert d.turn_index == 2 and d.drifted == 3
    turn1 = traj.ledger.turns[0]
    assert turn1.trained == len(out1) - 3 and turn1.masked == {"realigned": 3}
    assert_ledger_sums(traj.ledger)


def test_several_tool_calls_in_one_turn(mgr: TrajectoryManager) -> None:
    reply = assistant("", ("Read", {"path": "a"}), ("Read", {"path": "b"}), ("Bash", {"c": "ls"}))
    play(mgr, "s", [U1], reply)
    ledger = mgr.finish("s").ledger
    assert ledger.turns[0].tools == ["Read", "Read", "Bash"]
    assert ledger.by_tool["Read"]["turns"] == 1
    assert ledger.by_tool["Bash"]["turns_trained"] == 1


def test_sessions_are_isolated(mgr: TrajectoryManager) -> None:
    play(mgr, "a", [SYS, U1], A1)
    play(mgr, "b", [SYS, user("other task")], A2)
    assert mgr.turn_count("a") == 1 and mgr.turn_count("b") == 1
    (sa,) = mgr.get_trajectory("a")
    assert mgr.has_session("b") and not mgr.has_session("a")
    (sb,) = mgr.get_trajectory("b")
    assert sa.tokens.tolist() != sb.tokens.tolist()
    assert mgr.get_trajectory("a") == []


def test_empty_response_emits_nothing_but_is_counted(mgr: TrajectoryManager) -> None:
    play(mgr, "s", [U1], assistant(""), output=[], logprobs=[])
    traj = mgr.finish("s")
    assert traj.samples == []
    assert traj.ledger.turns[0].generated == 0


def test_empty_response_after_a_trained_turn(mgr: TrajectoryManager) -> None:
    out1 = play(mgr, "s", [SYS, U1], A1)
    play(mgr, "s", [SYS, U1, A1, T1], assistant(""), output=[], logprobs=[])
    (s,) = mgr.get_trajectory("s")
    assert s.trained_tokens == len(out1)


def _long_reply(n: int) -> dict:
    return assistant("y" * n)


class TestDrift:
    def test_early_divergence_forks(self, mgr: TrajectoryManager) -> None:
        play(mgr, "s", [SYS, U1], A1)
        prompt2 = prompt_ids([SYS, U1, A1, T1])
        prompt2[3] = 777  # inside the system prompt: not healable
        play(mgr, "s", [SYS, U1, A1, T1], A2, prompt=prompt2)
        traj = mgr.finish("s")
        assert traj.drift_counts == {"fork": 1}
        assert len(traj.samples) == 2
        assert traj.ledger.trained_tokens == traj.ledger.generated_tokens

    def test_short_drift_in_last_response_realigns(self, mgr: TrajectoryManager) -> None:
        out1 = play(mgr, "s", [SYS, U1], A1)
        prompt2 = prompt_ids([SYS, U1, A1, T1])
        prompt2[len(prompt_ids([SYS, U1])) + len(out1) - 1] = 555  # the END token drifts
        play(mgr, "s", [SYS, U1, A1, T1], A2, prompt=prompt2)
        traj = mgr.finish("s")
        assert traj.drift_counts == {"realign": 1}
        assert len(traj.samples) == 1
        assert traj.ledger.masked_tokens == {"realigned": 1}

    def test_divergence_in_an_earlier_turn_forks(self, mgr: TrajectoryManager) -> None:
        out1 = play(mgr, "s", [SYS, U1], A1)
        play(mgr, "s", [SYS, U1, A1, T1], A2)
        prompt3 = prompt_ids([SYS, U1, A1, T1, A2, user("more")])
        prompt3[len(prompt_ids([SYS, U1])) + 1] = 555  # inside turn 1's response
        play(mgr, "s", [SYS, U1, A1, T1, A2, user("more")], A1, prompt=prompt3)
        traj = mgr.finish("s")
        assert traj.drift_counts == {"clean": 1, "fork": 1}
        assert len(traj.samples) == 2
        assert trained_span(traj.samples[0], out1)

    @pytest.mark.parametrize("policy", ["minimal", "slime"])
    def test_threshold_zero_forks_on_any_drift(self, backend: str, policy: str) -> None:
        mgr = TrajectoryManager(backend=backend, fork_threshold_tokens=0, drift_policy=policy)
        out1 = play(mgr, "s", [SYS, U1], A1)
        prompt2 = prompt_ids([SYS, U1, A1, T1])
        prompt2[len(prompt_ids([SYS, U1])) + len(out1) - 1] = 555
        play(mgr, "s", [SYS, U1, A1, T1], A2, prompt=prompt2)
        traj = mgr.finish("s")
        assert traj.drift_counts == {"fork": 1}
        assert traj.ledger.trained_tokens == traj.ledger.generated_tokens

    def test_long_drift_forks_under_minimal(self, backend: str) -> None:
        mgr = TrajectoryManager(backend=backend, fork_threshold_tokens=8)
        out1 = play(mgr, "s", [U1], _long_reply(20))
        prompt2 = prompt_ids([U1, _long_reply(20), T1])
        prompt2[len(prompt_ids([U1])) + 5] = 555  # 15 drifted ids >= threshold 8
        play(mgr, "s", [U1, _long_reply(20), T1], A2, prompt=prompt2)
        traj = mgr.finish("s")
        assert traj.drift_counts == {"fork": 1}
        assert trained_span(traj.samples[0], out1)

    def test_long_incoming_output_forks_under_slime(self, backend: str) -> None:
        mgr = TrajectoryManager(backend=backend, fork_threshold_tokens=8, drift_policy="slime")
        play(mgr, "s", [U1], A1)
        prompt2 = prompt_ids([U1, A1, T1])
        prompt2[len(prompt_ids([U1])) + 2] = 555
        play(mgr, "s", [U1, A1, T1], _long_reply(20), prompt=prompt2)
        traj = mgr.finish("s")
        assert traj.drift_counts == {"fork": 1}

    def test_policies_differ_on_a_long_response_then_a_short_turn(self, backend: str) -> None:
        long_reply = _long_reply(200)
        results = {}
        for policy in ("slime", "minimal"):
            mgr = TrajectoryManager(backend=backend, drift_policy=policy)
            out1 = play(mgr, "s", [U1], long_reply)
            prompt2 = prompt_ids([U1, long_reply, T1])
            prompt2[len(prompt_ids([U1])) + len(out1) - 2] = 555  # 2 ids of 201 drift
            play(mgr, "s", [U1, long_reply, T1], A2, prompt=prompt2)
            traj = mgr.finish("s")
            assert traj.drift_counts == {"realign": 1}
            results[policy] = traj.ledger.turns[0]
        # upstream overwrites the whole latest response; minimal keeps what was sampled
        assert results["slime"].trained == 0
        assert results["slime"].masked == {"realigned": 201}
        assert results["minimal"].trained == 199
        assert results["minimal"].masked == {"realigned": 2}


def test_reward_on_every_sample(mgr: TrajectoryManager) -> None:
    play(mgr, "s", [SYS, U1], A1)
    play(mgr, "s", [SYS, user("another")], A2)
    samples = mgr.get_trajectory("s", reward=0.75, extra_metadata={"group": 3})
    assert len(samples) == 2
    assert all(s.reward == 0.75 and s.metadata["group"] == 3 for s in samples)


def test_cross_leaf_dedup_across_a_deep_tree(mgr: TrajectoryManager) -> None:
    """Every generated turn is trained by exactly one sample, however the tree branches."""
    history = [SYS, U1]
    for depth in range(4):
        reply = assistant(f"step {depth}", ("Bash", {"cmd": f"run {depth}"}))
        play(mgr, "s", history, reply)
        # a sibling branch at every level
        play(mgr, "s", [*history, reply, tool(f"failed {depth}")], assistant(f"retry {depth}"))
        history = [*history, reply, tool(f"ok {depth}")]
    play(mgr, "s", history, A2)
    traj = mgr.finish("s")
    assert len(traj.samples) == 5
    total_trained = sum(s.trained_tokens for s in traj.samples)
    assert total_trained == traj.ledger.generated_tokens == traj.ledger.trained_tokens
    assert all(t.trained == t.generated for t in traj.ledger.turns)


def test_routing_only_assistants_are_context(mgr: TrajectoryManager) -> None:
    injected = assistant("I was written by the harness")
    out = play(mgr, "s", [SYS, U1, injected, user("go on")], A2)
    (s,) = mgr.get_trajectory("s")
    assert s.trained_tokens == len(out)
    assert s.tokens[: s.prompt_length].tolist() == prompt_ids([SYS, U1, injected, user("go on")])


class TestRewriteMerge:
    @pytest.fixture
    def mgr(self, backend: str) -> TrajectoryManager:
        return TrajectoryManager(backend=backend, rewrite_policy="merge")

    def test_short_rewrite_is_absorbed_and_recorded(self, mgr: TrajectoryManager) -> None:
        play(mgr, "s", [SYS, U1], A1)
        rewritten = assistant("look (edited)", ("Read", {"path": "a.py"}))
        out2 = play(mgr, "s", [SYS, U1, rewritten, T1], A2)
        traj = mgr.finish("s")
        (s,) = traj.samples  # no fork: the rewrite took over the node
        assert s.trained_tokens == len(out2)
        turn1 = traj.ledger.turns[0]
        assert turn1.trained == 0 and turn1.masked == {"merged_rewrite": len(sampled(A1))}
        assert turn1.tools == ["Read"]
        assert_ledger_sums(traj.ledger)

    def test_match_key_follows_the_rewrite(self, mgr: TrajectoryManager) -> None:
        play(mgr, "s", [SYS, U1], A1)
        rewritten = assistant("edited")
        play(mgr, "s", [SYS, U1, rewritten, T1], A2)
        play(mgr, "s", [SYS, U1, rewritten, T1, A2, user("again")], A1)
        root = mgr.root("s")
        (sys_node,) = root.children
        (u_node,) = sys_node.children
        (a_node,) = u_node.children
        assert a_node.message == rewritten and a_node.turn is None
        assert len(mgr.get_trajectory("s")) == 1

    def test_long_generated_turn_forks_instead(self, backend: str) -> None:
        mgr = TrajectoryManager(backend=backend, fork_threshold_tokens=8, rewrite_policy="merge")
        play(mgr, "s", [U1], _long_reply(20))
        play(mgr, "s", [U1, assistant("rewritten"), T1], A2)
        traj = mgr.finish("s")
        assert len(traj.samples) == 2
        assert "merged_rewrite" not in traj.ledger.masked_tokens

    def test_threshold_zero_forks(self, backend: str) -> None:
        mgr = TrajectoryManager(backend=backend, fork_threshold_tokens=0, rewrite_policy="merge")
        play(mgr, "s", [U1], A1)
        play(mgr, "s", [U1, assistant("rewritten"), T1], A2)
        assert len(mgr.finish("s").samples) == 2

    def test_fork_policy_trains_the_rewritten_turn_as_its_own_sample(self, backend: str) -> None:
        mgr = TrajectoryManager(backend=backend, rewrite_policy="fork")
        out1 = play(mgr, "s", [SYS, U1], A1)
        out2 = play(mgr, "s", [SYS, U1, assistant("edited"), T1], A2)
        traj = mgr.finish("s")
        first, second = traj.samples
        assert trained_span(first, out1) and trained_span(second, out2)
        assert traj.ledger.trained_tokens == traj.ledger.generated_tokens
        assert traj.ledger.masked_tokens == {}

    def test_two_assistant_children_fork(self, mgr: TrajectoryManager) -> None:
        play(mgr, "s", [U1], A1)
        play(mgr, "s", [U1], assistant("a second sample"))
        play(mgr, "s", [U1, assistant("rewritten"), T1], A2)
        traj = mgr.finish("s")
        assert len(traj.samples) == 3
        assert "merged_rewrite" not in traj.ledger.masked_tokens


def test_tree_fork_stacked_with_token_drift(mgr: TrajectoryManager) -> None:
    out1 = play(mgr, "s", [SYS, U1], A1)
    play(mgr, "s", [SYS, U1, A1, T1], A2)
    # a second branch off turn 1, whose prompt also re-tokenizes turn 1's END
    msgs = [SYS, U1, A1, tool("different result")]
    prompt = prompt_ids(msgs)
    prompt[len(prompt_ids([SYS, U1])) + len(out1) - 1] = 555
    play(mgr, "s", msgs, assistant("branch"), prompt=prompt)
    traj = mgr.finish("s")
    assert len(traj.samples) == 2
    assert traj.drift_counts == {"clean": 1, "realign": 1}
    # turn 1 was trained in full by the first leaf; the drift on the other leaf costs nothing
    assert traj.ledger.turns[0].trained == len(out1)
    assert_ledger_sums(traj.ledger)


def test_long_mixed_session(mgr: TrajectoryManager) -> None:
    history = [SYS, U1]
    outputs = []
    for k in range(30):
        reply = assistant(f"step {k}", ("Edit", {"file": f"f{k % 3}.py", "n": k}))
        if k % 7 == 6:
            reply = assistant(f"thinking out loud {k}")
        outputs.append(play(mgr, "s", history, reply))
        history = [*history, reply, tool(f"result {k}") if "tool_calls" in reply else user("ok")]
        if k == 10:  # a sub-agent under the same session id
            play(mgr, "s", [system("sub agent"), user("look up x")], assistant("x is 1"))
    traj = mgr.finish("s", max_sample_tokens=0)
    assert len(traj.samples) == 2
    assert traj.ledger.trained_tokens == traj.ledger.generated_tokens
    assert traj.ledger.by_tool["Edit"]["turns"] == 26
    assert_ledger_sums(traj.ledger)


def test_truncation_is_counted(mgr: TrajectoryManager) -> None:
    out1 = play(mgr, "s", [SYS, U1], A1)
    out2 = play(mgr, "s", [SYS, U1, A1, T1], A2)
    limit = len(prompt_ids([SYS, U1])) + len(out1) + 2
    traj = mgr.finish("s", max_sample_tokens=limit)
    (s,) = traj.samples
    assert len(s.tokens) == limit and s.metadata["truncated"] is True
    assert traj.ledger.turns[1].masked == {"truncated": len(out2)}
    assert traj.ledger.turns[0].trained == len(out1)
    assert_ledger_sums(traj.ledger)


class TestBadInput:
    def _before(self, mgr: TrajectoryManager) -> str:
        play(mgr, "s", [SYS, U1], A1)
        return format_tree(mgr, "s")

    @pytest.mark.parametrize(
        "turn, error",
        [
            (TurnRecord([1, 2], [3, 4], "stop", [-0.1]), LogprobLengthError),
            (TurnRecord([1, -2], [3], "stop"), TokenIdError),
            (TurnRecord([1, 2], [3.5], "stop"), TokenIdError),
            (TurnRecord([1, 2], [True], "stop"), TokenIdError),
            (TurnRecord([1, 2**32], [3], "stop"), TokenIdError),
            (TurnRecord(np.array([1, -1]), [3], "stop"), TokenIdError),
            (TurnRecord("12", [3], "stop"), TokenIdError),
        ],
    )
    def test_bad_turns(self, mgr: TrajectoryManager, turn: TurnRecord, error: type) -> None:
        before = self._before(mgr)
        with pytest.raises(error) as info:
            mgr.record_turn("s", turn=turn, prompt_messages=[SYS, U1, A1, T1], response_message=A2)
        assert isinstance(info.value, ValueError)
        assert format_tree(mgr, "s") == before and mgr.turn_count("s") == 1

    @pytest.mark.parametrize(
        "messages",
        [
            "not a list",
            {"role": "user"},
            [SYS, "text"],
            [SYS, {"content": "no role"}],
            [SYS, {"role": 3, "content": "x"}],
            [SYS, {"role": "user", "content": object()}],
        ],
    )
    def test_bad_messages(self, mgr: TrajectoryManager, messages: object) -> None:
        before = self._before(mgr)
        with pytest.raises(MessageError):
            mgr.record_turn(
                "s",
                turn=TurnRecord([1], [2], "stop"),
                prompt_messages=messages,
                response_message=A2,
            )
        assert format_tree(mgr, "s") == before

    def test_empty_prompt_messages_are_refused(self, mgr: TrajectoryManager) -> None:
        # A generated turn with no prompt to route by would be lost: refuse it by name.
        with pytest.raises(MessageError, match="must not be empty"):
            mgr.record_turn(
                "s", turn=TurnRecord([1], [2], "stop"), prompt_messages=[], response_message=A2
            )
        assert mgr.turn_count("s") == 0

    def test_bad_settings(self) -> None:
        with pytest.raises(PolicyError):
            TrajectoryManager(drift_policy="greedy")
        with pytest.raises(PolicyError):
            TrajectoryManager(fork_threshold_tokens=-1)
        with pytest.raises(PolicyError):
            TrajectoryManager(backend="fortran")
        with pytest.raises(PolicyError):
            TrajectoryManager(rewrite_policy="squash")
        with pytest.raises(PolicyError):
            TrajectoryManager().finish("s", max_sample_tokens=-5)


def test_sample_round_trips_through_dict(mgr: TrajectoryManager) -> None:
    from tokentrail import Sample

    play(mgr, "s", [SYS, U1], A1)
    (s,) = mgr.get_trajectory("s", reward=1.0)
    d = s.to_dict()
    assert set(d) == {
        "tokens",
        "loss_mask",
        "rollout_log_probs",
        "response_length",
        "reward",
        "metadata",
    }
    back = Sample.from_dict(d)
    assert back.tokens.tolist() == s.tokens.tolist()
    assert back.loss_mask.tolist() == s.loss_mask.tolist()


def test_debug_views(mgr: TrajectoryManager) -> None:
    play(mgr, "s", [SYS, U1], A1)
    tree = format_tree(mgr, "s")
    assert "turn 1:" in tree and "calls=['Read']" in tree
    (s,) = mgr.get_trajectory("s")
    text = format_sample(s)
    assert text.count("\n") == len(s.tokens)
    assert f"{END:>8}    1" in text


@settings(max_examples=25, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 50), st.booleans(), st.sampled_from(["ok", "go on", "why"])),
        min_size=1,
        max_size=12,
    ),
    policy=st.sampled_from(["merge", "fork"]),
)
def test_find_reply_is_the_tree_walk_of_find_turn(steps, policy) -> None:
    """The reply-id lookup (a Responses `previous_response_id`) equals the whole-tree walk, on
    sessions that branch, continue and rewrite their generated turns (a merge demotes them)."""
    mgr = TrajectoryManager(rewrite_policy=policy)
    conversations: list[list[dict]] = [[SYS, user("start")]]
    replies = []
    for n, (base, rewrite, text) in enumerate(steps):
        messages = list(conversations[base % len(conversations)])
        if rewrite and messages[-1]["role"] == "assistant":
            messages[-1] = assistant(f"{messages[-1]['content']} (edited)")
        if messages[-1]["role"] == "assistant":
            messages.append(user(text))
        reply = assistant(f"reply {n}")
        reply_id = f"resp_{n}"
        mgr.record_turn(
            "s",
            turn=TurnRecord(prompt_ids(messages), sampled(reply), "stop", None),
            prompt_messages=messages,
            response_message=reply,
            metadata={"reply_id": reply_id, "call_ids": []},
        )
        replies.append(reply_id)
        conversations.append([*messages, reply])
    for reply_id in [*replies, "resp_unknown"]:
        assert mgr.find_reply("s", reply_id) == mgr.find_turn("s", "reply_id", reply_id)
    assert mgr.find_reply("other", replies[0]) is None
