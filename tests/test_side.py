"""Side conversations: every sample says which conversation it came from, and side requests a
harness makes with the session's key (memory agents, summarizers) can be excluded from training
without being dropped: served, journaled, and counted in the ledger as `excluded`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tokens import assistant, play, system, user
from tokentrail import TrajectoryManager
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.adapter.config import SessionSettings
from tokentrail.adapter.turn.turns import EXCLUDE_HEADER
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.errors import PolicyError
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.read import read_journal
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.side import KNOWN_SIDE_REQUESTS, SideRules, system_fingerprint

# The first words of the real side requests (captured from Qwen Code 0.24.4 and hermes-agent
# 0.19.0 against a stub; see `side.KNOWN_SIDE_REQUESTS`).
QWEN_MEMORY = (
    "You are now acting as the managed memory extraction subagent for an AI coding assistant."
    "\n\nThe recent conversation history is already in your context."
)
HERMES_SUMMARY = (
    "You are a summarization agent creating a context checkpoint. Treat the conversation turns "
    "below as source material for a compact record of prior work.\n\nTURNS TO SUMMARIZE:\n..."
)
# opencode's title prompt (`packages/opencode/src/agent/prompt/title.txt`; kilo ships it too).
TITLE = (
    "You are a title generator. You output ONLY a thread title. Nothing else.\n\n<task>\n"
    "Generate a brief title that would help the user find this conversation later.\n</task>"
)
# Claude Code's session title requests, as a terminal session sends them (the system blocks
# joined; the middle shortened; tests/fixtures/requests/claude_code_*_interactive_session_title
# holds them whole): 2.1.332's prompt after the billing header and the CLI's line, and 2.1.197's.
CLAUDE_TITLE = (
    "x-anthropic-billing-header: cc_version=2.1.332.968; cc_entrypoint=cli;\n"
    "You are Claude Code, Anthropic's official CLI for Claude.\n"
    "You are naming a coding session so the user can pick it out of a long list of sessions. "
    "The title is a name for what the session is about, not a sentence describing the task.\n\n"
    "The session content is provided inside <session> tags.\n\n"
    'Return JSON with a single "title" field. Capitalize the first letter of the title.'
)
CLAUDE_TITLE_2_1_197 = (
    "x-anthropic-billing-header: cc_version=2.1.197.e46; cc_entrypoint=cli;\n"
    "You are Claude Code, Anthropic's official CLI for Claude.\n"
    "Generate a concise, sentence-case title (3-7 words) that captures the main topic or goal "
    'of this coding session.\n\nReturn JSON with a single "title" field.'
)
# hermes-agent 0.19.0's skill review (`agent/background_review.py`, the start of
# `_SKILL_REVIEW_PROMPT`): the last user message of a replay of the main conversation.
HERMES_REVIEW = (
    "Review the conversation above and update the skill library. Be ACTIVE \u2014 most "
    "sessions produce at least one skill update, even if small."
)
MAIN_SYSTEM = "You are Qwen Code, a non-interactive CLI agent."
AGENT_PROMPT = "Find every TODO comment in the repository and list the files that hold them."


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


# --- tags -------------------------------------------------------------------------------------


def test_samples_are_tagged_with_their_conversation() -> None:
    manager = TrajectoryManager()
    main = [system(MAIN_SYSTEM), user("tidy the repo")]
    call = assistant("", ("Agent", {"description": "find todos", "prompt": AGENT_PROMPT}))
    play(manager, "s", main, call)
    sub = [system("You are a search sub-agent."), user(AGENT_PROMPT)]
    play(manager, "s", sub, assistant("Two files."))
    play(manager, "s", [user(HERMES_SUMMARY)], assistant("## Summary"))
    samples = manager.finish("s").samples
    tags = [s.metadata["conversation"] for s in samples]
    assert tags == [
        {
            "root_branch": 0,
            "system_fingerprint": system_fingerprint(main),
            "subagent": False,
        },
        {"root_branch": 1, "system_fingerprint": system_fingerprint(sub), "subagent": True},
        {"root_branch": 2, "system_fingerprint": None, "subagent": False},
    ]
    assert tags[0]["system_fingerprint"] != tags[1]["system_fingerprint"]


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        # opencode and kilo
        ("task", {"description": "find todos", "prompt": AGENT_PROMPT, "subagent_type": "general"}),
        # cline
        ("spawn_agent", {"task": AGENT_PROMPT}),
    ],
)
def test_other_harnesses_sub_agents_are_tagged(tool: str, arguments: dict[str, Any]) -> None:
    manager = TrajectoryManager()
    play(
        manager, "s", [system(MAIN_SYSTEM), user("tidy the repo")], assistant("", (tool, arguments))
    )
    play(manager, "s", [system("You are a sub-agent."), user(AGENT_PROMPT)], assistant("Two."))
    tags = [s.metadata["conversation"]["subagent"] for s in manager.finish("s").samples]
    assert tags == [False, True]


def test_a_bad_pattern_is_a_named_error() -> None:
    with pytest.raises(PolicyError, match="bad side-conversation pattern"):
        SideRules.compile(["(unclosed"])


# --- exclusion through the adapter ------------------------------------------------------------


def run_session(
    tokenizer, requests: list[tuple[list[dict], dict[str, str]]], journal: Path | None = None,
    **config: Any,
) -> tuple[Any, list[int], str]:  # fmt: skip
    """Send each (messages, headers) as its own request; return the finished trajectory, each
    reply's HTTP status and the metrics after the finish."""
    script = [[{"type": "text", "text": "Noted."}]]
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer, script),
        tokenizer=tokenizer,
        config=AdapterConfig(**config),
        journal=Journal(journal) if journal else None,
    )

    async def go() -> tuple[Any, list[int], str]:
        runner, url = await start_server(adapter)
        statuses = []
        try:
            async with aiohttp.ClientSession() as http:
                for messages, headers in requests:
                    async with http.post(
                        f"{url}/v1/chat/completions",
                        json={"model": "m", "messages": messages},
                        headers={"Authorization": "Bearer s", **headers},
                    ) as resp:
                        statuses.append(resp.status)
                        await resp.read()
                trajectory = await adapter.finish_trajectory("s")
                async with http.get(f"{url}/metrics") as resp:
                    metrics = await resp.text()
            return trajectory, statuses, metrics
        finally:
            await runner.cleanup()

    return asyncio.run(go())


MAIN = [{"role": "system", "content": MAIN_SYSTEM}, {"role": "user", "content": "hi"}]
MEMORY = [{"role": "system", "content": QWEN_MEMORY}, {"role": "user", "content": "extract"}]
SUMMARY = [{"role": "user", "content": HERMES_SUMMARY}]
TITLE_REQUEST = [{"role": "system", "content": TITLE}, {"role": "user", "content": "fix it"}]
CC_TITLE = [
    {"role": "system", "content": CLAUDE_TITLE},
    {"role": "user", "content": "<session>\nfix calc.py\n</session>"},
]
CC_TITLE_2_1_197 = [
    {"role": "system", "content": CLAUDE_TITLE_2_1_197},
    {"role": "user", "content": "<session>\nfix calc.py\n</session>"},
]
HERMES_MAIN = [
    {"role": "system", "content": "You are Hermes Agent, an intelligent AI assistant."},
    {"role": "user", "content": "What does pyproject.toml say?"},
    {"role": "assistant", "content": "It names the project demo."},
]
REVIEW = [*HERMES_MAIN, {"role": "user", "content": HERMES_REVIEW}]
# Claude Code's main conversation: the same system message holds none of it.
CC_MAIN = [
    {
        "role": "system",
        "content": CLAUDE_TITLE.split("You are naming")[0]
        + "You are an agent working with the user. Return JSON when asked.",
    },
    {"role": "user", "content": 'Name it: return JSON with a single "title" field.'},
]
# A provider header may come first in the same system message.
HEADED_TITLE = [{"role": "system", "content": f"You are a helpful assistant.\n{TITLE}"},
                {"role": "user", "content": "fix it"}]  # fmt: skip


def test_known_side_requests_are_served_journaled_and_masked_as_excluded(
    tokenizer, tmp_path: Path
) -> None:
    path = tmp_path / "run.db"
    trajectory, statuses, metrics = run_session(
        tokenizer,
        [(MAIN, {}), (MEMORY, {}), (SUMMARY, {}), (TITLE_REQUEST, {}), (HEADED_TITLE, {}),
         (CC_TITLE, {}), (CC_TITLE_2_1_197, {})],
        journal=path,
        exclude_known_side_requests=True,
    )  # fmt: skip
    assert statuses == [200] * 7
    ledger = trajectory.ledger
    # Each reason names the rule that fired: the harness and the release it was seen in.
    title = "known:opencode 1.18.33 title generator"
    cc_title = "known:claude-code 2.1.332 session title"
    cc_title_2_1_197 = "known:claude-code 2.1.197 session title"
    assert [t.excluded for t in ledger.turns] == [
        None,
        "known:qwen-code 0.24.4 memory extraction",
        "known:hermes-agent 0.19.0 summarizer",
        title,
        title,
        cc_title,
        cc_title_2_1_197,
    ]
    side = [t.generated for t in ledger.turns[1:]]
    assert ledger.masked_tokens == {"excluded": sum(side)}
    assert ledger.trained_tokens == ledger.turns[0].generated
    assert ledger.to_dict()["excluded_turns"] == 6
    (sample,) = trajectory.samples
    assert sample.metadata["turns"] == [1]
    assert f'tokentrail_masked_tokens_total{{reason="excluded"}} {float(sum(side))}' in metrics
    # Journaled like any other turn, with the reason kept for recovery and replay.
    turns = read_journal(path).served_turns()
    assert [t.metadata.get("excluded") is not None for t in turns] == [False] + [True] * 6


def test_each_known_rule_fires_on_its_side_request_only() -> None:
    rules = SideRules.compile([], KNOWN_SIDE_REQUESTS)
    assert rules.match(CC_TITLE) == "known:claude-code 2.1.332 session title"
    assert rules.match(CC_TITLE_2_1_197) == "known:claude-code 2.1.197 session title"
    # The main conversation's system prompt, and a user asking for a title there, are not.
    assert rules.match(CC_MAIN) is None
    assert rules.match(MAIN) is None
    # hermes-agent's background review is told by its last user message, not its first.
    assert rules.match(REVIEW) == "known:hermes-agent 0.19.0 background review"
    assert rules.match(HERMES_MAIN) is None
    assert rules.match([*REVIEW, {"role": "assistant", "content": "Nothing to save."}]) == (
        "known:hermes-agent 0.19.0 background review"
    )
    # A user quoting the ask mid-message, or an earlier turn's ask, is not a review.
    quoted = [*HERMES_MAIN, {"role": "user", "content": f"Please: {HERMES_REVIEW}"}]
    assert rules.match(quoted) is None
    assert rules.match([*REVIEW, {"role": "user", "content": "thanks"}]) is None
    # A pattern of one's own reads the first message only.
    assert SideRules.compile(["Review the conversation"]).match(REVIEW) is None
    names = [rule.name for rule in KNOWN_SIDE_REQUESTS]
    assert len(set(names)) == len(names)
    assert all(rule.version[0].isdigit() for rule in KNOWN_SIDE_REQUESTS)


def test_a_header_or_a_pattern_excludes_and_nothing_else_does(tokenizer) -> None:
    trajectory, _, _ = run_session(
        tokenizer,
        [
            (MAIN, {}),
            ([{"role": "system", "content": "Write a title."}, *MAIN[1:]], {}),
            ([{"role": "system", "content": "other"}, *MAIN[1:]], {EXCLUDE_HEADER: "title"}),
            ([{"role": "system", "content": "other 2"}, *MAIN[1:]], {EXCLUDE_HEADER: "0"}),
            (MEMORY, {}),
        ],
        exclude_patterns=("^Write a title",),
    )
    assert [t.excluded for t in trajectory.ledger.turns] == [
        None,
        "pattern:^Write a title",
        "header",
        None,
        None,
    ]
    assert len(trajectory.samples) == 3


def test_a_session_can_exclude_its_own_side_conversations(tokenizer) -> None:
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer, [[{"type": "text", "text": "ok"}]]),
        tokenizer=tokenizer,
    )
    adapter.open_session("s", SessionSettings(exclude_patterns=("memory extraction",)))
    adapter.open_session("t")

    async def go() -> tuple[Any, Any]:
        runner, url = await start_server(adapter)
        try:
            for sid in ("s", "t"):
                client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=sid, max_retries=0)
                await client.chat.completions.create(model="m", messages=MEMORY)
            return await adapter.finish_trajectory("s"), await adapter.finish_trajectory("t")
        finally:
            await runner.cleanup()

    own, other = asyncio.run(go())
    assert own.ledger.turns[0].excluded == "pattern:memory extraction" and not own.samples
    assert other.ledger.turns[0].excluded is None and len(other.samples) == 1


def test_a_review_that_replays_the_main_conversation_is_masked_and_the_main_one_kept(
    tokenizer,
) -> None:
    # hermes-agent's review fork sends the main conversation as it stands, the reply included,
    # with its ask appended: it extends the main conversation's branch, and only its own turn
    # is excluded.
    main = HERMES_MAIN[:2]
    trajectory, statuses, _ = run_session(
        tokenizer,
        [(main, {}), ([*main, {"role": "assistant", "content": "Noted."}, REVIEW[-1]], {})],
        exclude_known_side_requests=True,
    )
    assert statuses == [200, 200]
    ledger = trajectory.ledger
    assert [t.excluded for t in ledger.turns] == [
        None,
        "known:hermes-agent 0.19.0 background review",
    ]
    assert ledger.trained_tokens == ledger.turns[0].generated > 0
    assert [s.metadata["turns"] for s in trajectory.samples] == [[1]]
