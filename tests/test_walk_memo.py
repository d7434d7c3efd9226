"""A late turn's walks of its session's tree take what the previous turn found (`WalkMemo`,
the restore's `Seen`, the splice's call count, the tags read at record): on generated
sessions, a manager fed the harness's very objects, as the request memo hands them on,
decides exactly what a manager fed fresh copies decides when it remembers no walk (each goes
from the root), turn by turn, and finishes into the same samples and ledger (the reference
reading every turn's tags and tool names at finish).

The sessions mix what changes an earlier walk: echoes resent exactly, with keys reordered
and with trailing whitespace, rewrites (merged under `RewritePolicy.MERGE`), forks from an
earlier message, retries of the same prompt (superseding or not) and switches between
branches.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tokens import assistant, prompt_ids, sampled, system, tool, user
from tokentrail import TrajectoryManager, TurnRecord
from tokentrail.text.families import count_calls
from tokentrail.trajectory.prompts import _SpliceChecks
from tokentrail.trajectory.tree import WalkMemo, equal_run, shared_run

Message = dict[str, Any]

# What the harness does next on a branch: resend our reply (and how), or something else.
ACTIONS = ("echo", "reordered", "spaced", "rewrite", "fork", "retry", "switch")


def _reply(turn: int) -> Message:
    if turn % 3 == 2:
        return assistant(f"done {turn}")
    return assistant(f"step {turn}", ("Read", {"path": f"f{turn}.py", "limit": turn}))


def _echo(reply: Message, how: str) -> Message:
    if how == "reordered":
        out = dict(reversed(list(reply.items())))
        if "tool_calls" in out:
            out["tool_calls"] = [
                {**call, "function": dict(reversed(list(call["function"].items())))}
                for call in out["tool_calls"]
            ]
        return out
    if how == "spaced":
        return {**reply, "content": reply["content"] + "  "}
    if how == "rewrite":
        return assistant(f"rewritten {reply['content']}")
    return reply


def _forget(manager: TrajectoryManager) -> None:
    """The reference: a session that remembers no walk (every walk from the root)."""
    session = manager._sessions.get("s")  # noqa: SLF001 - the state under test
    if session is not None:
        session.walked = WalkMemo([], [], 0)
        session.echoes.seen = None


def _keep(manager: TrajectoryManager) -> None:
    pass


class _Harness:
    """Both managers' inputs: the same conversations, one side's messages the very objects
    of its previous request (and `unchanged` saying how many), the other's fresh copies."""

    def __init__(self, policy: str) -> None:
        self.fast = TrajectoryManager(rewrite_policy=policy, fork_threshold_tokens=64)
        self.slow = TrajectoryManager(rewrite_policy=policy, fork_threshold_tokens=64)
        self.branches: list[list[Message]] = [[system("sys"), user("go")]]
        self.last: list[list[Message] | None] = [None]
        self.previous: list[Message] = []
        self.replies: dict[int, Message] = {}
        self.last_reply: Message = {}
        self.turn = 0

    def send(self, messages: list[Message], supersede: bool) -> None:
        unchanged = shared_run(messages, self.previous, len(messages))
        self.previous = messages
        fresh = copy.deepcopy(messages)
        reply = _reply(self.turn)
        output = sampled(reply)
        self.turn += 1
        seen = []
        for manager, msgs, known in ((self.fast, messages, unchanged), (self.slow, fresh, 0)):
            forget = _forget if manager is self.slow else _keep
            forget(manager)
            restored, keys, echo_ids = manager.restore_keyed("s", msgs, None, known)
            forget(manager)
            anchor = manager.splice_anchor("s", restored, keys)
            forget(manager)
            retried = manager.unanswered_turns("s", restored, prompt_ids(restored), keys)
            forget(manager)
            index = manager.record_turn(
                "s",
                turn=TurnRecord(prompt_ids(restored), output, "stop", [-0.5] * len(output)),
                prompt_messages=restored,
                response_message=copy.deepcopy(reply),
                keys=keys,
                supersede=supersede,
            )
            seen.append(
                (
                    [json.dumps(m) for m in restored],
                    keys,
                    echo_ids,
                    None
                    if anchor is None
                    else (
                        anchor.index,
                        json.dumps(anchor.message),
                        list(anchor.prompt_ids),
                        list(anchor.output_ids),
                    ),
                    retried,
                    index,
                    manager.restored_echoes("s"),
                    manager.restored_by_tool("s"),
                )
            )
        assert seen[0] == seen[1]
        self.last_reply = reply

    def step(self, action: str, branch: int, at: int, supersede: bool) -> None:
        b = branch % len(self.branches)
        messages = self.branches[b]
        if action == "fork":
            base = messages[: 1 + at % len(messages)]
            self.branches.append([*base, user(f"fork {self.turn}")])
            b = len(self.branches) - 1
            self.last.append(None)
        elif action == "retry" and self.last[b] is not None:
            self.send(list(self.last[b] or ()), supersede)
            return
        elif action != "switch" and self.last[b] is not None:
            echo = _echo(self.replies[b], action)
            self.branches[b] = [*messages, echo, tool(f"out {self.turn}")]
        conversation = list(self.branches[b])
        self.send(conversation, supersede)
        self.last[b] = conversation
        self.replies[b] = self.last_reply


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["fork", "merge"]),
    st.lists(
        st.tuples(
            st.sampled_from(ACTIONS),
            st.integers(0, 5),
            st.integers(0, 40),
            st.booleans(),
        ),
        min_size=1,
        max_size=24,
    ),
)
def test_the_remembered_walks_decide_what_fresh_ones_do(
    policy: str, script: list[tuple[str, int, int, bool]]
) -> None:
    harness = _Harness(policy)
    for action, branch, at, supersede in script:
        harness.step(action, branch, at, supersede)
    # The reference reads every turn's tags and tool names at finish.
    session = harness.slow._sessions["s"]  # noqa: SLF001 - the state under test
    session.tags.clear()
    session.tools.clear()
    fast, slow = harness.fast.finish("s"), harness.slow.finish("s")
    assert [s.to_dict() | {"tokens": s.tokens.tolist()} for s in fast.samples] == [
        s.to_dict() | {"tokens": s.tokens.tolist()} for s in slow.samples
    ]
    assert fast.ledger.to_dict() == slow.ledger.to_dict()


@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12))
def test_shared_run_counts_the_leading_same_objects(a: list[int], b: list[int]) -> None:
    objects = [object() for _ in range(4)]
    xs, ys = [objects[i] for i in a], [objects[i] for i in b]
    expected = 0
    for x, y in zip(xs, ys, strict=False):
        if x is not y:
            break
        expected += 1
    for limit in (0, 3, 100):
        assert shared_run(xs, ys, limit) == min(expected, limit)


@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12))
def test_equal_run_counts_the_leading_equal_items(a: list[int], b: list[int]) -> None:
    # Equal values, some the same objects and some not.
    xs, ys = [[i] for i in a], [[i] for i in b]
    ys[: len(xs) // 2] = xs[: len(ys) // 2]
    expected = 0
    for x, y in zip(xs, ys, strict=False):
        if x != y:
            break
        expected += 1
    for limit in (0, 3, 100):
        assert equal_run(xs, ys, limit) == min(expected, limit)


@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 5), max_size=10), st.integers(0, 10)),
        min_size=1,
        max_size=8,
    )
)
def test_the_splice_call_count_is_the_full_count(calls: list[tuple[list[int], int]]) -> None:
    pool = [
        user("u"),
        assistant("x", ("Read", {}), ("Bash", {})),
        tool("t"),
        assistant("y", ("Edit", {})),
        assistant("z"),
    ]
    pool.append(copy.deepcopy(pool[1]))  # equal to one, not the same object
    checks = _SpliceChecks(every=1)
    for picks, index in calls:
        messages = [pool[i] for i in picks]
        index = min(index, len(messages))
        assert checks.calls_before(messages, index) == count_calls(messages[:index])
