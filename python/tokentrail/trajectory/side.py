"""Side conversations: what a harness asks beside the agent's own conversation, with the same
API key (Qwen Code's memory-extraction agent, hermes-agent's context summarizer, title and
compaction requests, opencode's and kilo's title generator).

Every sample is tagged with the conversation it came from: the branch of the session's tree it
hangs from, a fingerprint of its system prompt, and whether it is a sub-agent (its first user
message carries the prompt of a sub-agent call made elsewhere in the session: Claude Code's
`Agent`/`Task`, Qwen Code's `agent`, hermes-agent's `delegate_task`, opencode's and kilo's
`task`, cline's `spawn_agent`; see `SUBAGENT_TOOLS`). A session
or the server can exclude side conversations by a pattern on their first message (the system
prompt, or the first user message when there is none) or by a request header: excluded turns
are served and journaled like any other, and the ledger masks their tokens as `excluded`.
`--exclude-side-requests` adds the side requests seen from real harnesses (`KNOWN_SIDE_REQUESTS`),
each a rule named with the harness and the release it was seen in: the ledger's `excluded`
reason names the rule that fired (`known:claude-code 2.1.332 session title`). A known rule reads
the first message, or the request's last user message for a side request that replays the main
conversation and appends its own ask (hermes-agent's background review).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypedDict

from tokentrail.errors import PolicyError
from tokentrail.messages import Message
from tokentrail.trajectory.tree import Node

__all__ = [
    "KNOWN_SIDE_REQUESTS",
    "SUBAGENT_TOOLS",
    "ConversationTags",
    "Reads",
    "SideRule",
    "SideRules",
    "conversation_tags",
    "exclusion",
    "system_fingerprint",
]


class ConversationTags(TypedDict):
    """`conversation_tags`: the conversation a sample came from, in its metadata."""

    root_branch: int | None
    system_fingerprint: str | None
    subagent: bool


class Reads(Enum):
    """Which message of a request a side rule searches."""

    # The conversation's first message (the system prompt, or the first user message).
    FIRST = "first"
    # The request's last user message: a side request that replays the main conversation
    # and appends its own ask, which no first message tells apart.
    LAST_USER = "last_user"


@dataclass(frozen=True)
class SideRule:
    """A side request a real harness makes, recognized by one of its messages (`reads`): the
    harness, the release it was seen in, what the request is for, and the pattern (searched)."""

    harness: str
    version: str
    what: str
    pattern: str
    reads: Reads = Reads.FIRST

    @property
    def name(self) -> str:
        return f"{self.harness} {self.version} {self.what}"


# The side requests captured from the real harnesses; `--exclude-side-requests` excludes
# them all.
KNOWN_SIDE_REQUESTS = (
    SideRule(
        "qwen-code",
        "0.24.4",
        "memory extraction",
        r"\AYou are now acting as the managed memory extraction subagent",
    ),
    SideRule(
        "hermes-agent",
        "0.19.0",
        "summarizer",
        r"\AYou are a summarization agent creating a context checkpoint",
    ),
    # After a reply that took 10 tool-calling iterations (the skill review) or every 10 user
    # turns (the memory review), hermes-agent forks a review agent in the background: the main
    # conversation replayed, the same system prompt, and one more user message asking it to
    # review the conversation (`agent/background_review.py`'s three prompts).
    SideRule(
        "hermes-agent",
        "0.19.0",
        "background review",
        r"\AReview the conversation above and "
        r"(?:update the skill library|consider saving to memory|update two things)",
        Reads.LAST_USER,
    ),
    # `agent/prompt/title.txt`, which kilo shares; a provider header may come before it, so it
    # is anchored at a line.
    SideRule(
        "opencode",
        "1.18.33",
        "title generator",
        r"(?m)^You are a title generator\. You output ONLY a thread title\.",
    ),
    # Claude Code names the session where a person sees it: in its interactive terminal, at
    # the start of the first turn beside the agent's own request (and for the Agent SDKs; a
    # `claude -p` run never asks). The system message holds a billing header and the CLI's
    # line first, each a text block of its own, so the prompt is anchored at a line. The real
    # request bodies are in tests/fixtures/requests/claude_code_*_interactive_session_title.
    SideRule(
        "claude-code",
        "2.1.332",
        "session title",
        r"(?m)^You are naming a coding session so the user can pick it out of a long list"
        r'[\s\S]*Return JSON with a single "title" field',
    ),
    # The prompt 2.1.197 asks with (and the wording that was reported for 2.1.332).
    SideRule(
        "claude-code",
        "2.1.197",
        "session title",
        r"(?m)^Generate a concise, sentence-case title \(3-7 words\)"
        r'[\s\S]*Return JSON with a single "title" field',
    ),
)
# Tools that start a sub-agent, whose prompt (any string argument of prompt length: `prompt`
# for most, cline's `task`) the sub-agent's first user message carries: Claude Code's `Agent`
# (`Task` before 2.1), Qwen Code's `agent`, hermes-agent's `delegate_task`, opencode's and
# kilo's `task`, cline's `spawn_agent`.
SUBAGENT_TOOLS = frozenset({"Agent", "Task", "agent", "delegate_task", "task", "spawn_agent"})
# Shorter argument strings are labels ("description"), not prompts.
_MIN_PROMPT = 20


def _first_text(messages: Sequence[Message]) -> str:
    if not messages:
        return ""
    content = messages[0].get("content")
    return content if isinstance(content, str) else ""


def _last_user_text(messages: Sequence[Message]) -> str:
    last = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    content = last.get("content") if last is not None else None
    return content if isinstance(content, str) else ""


@dataclass(frozen=True)
class SideRules:
    """Patterns (regular expressions, searched) on a conversation's first message (or, for a
    known rule that says so, the request's last user message), each with the reason a match is
    excluded for (`pattern:<the pattern>`, or a known rule's name)."""

    patterns: tuple[re.Pattern[str], ...] = ()
    reasons: tuple[str, ...] = ()
    reads: tuple[Reads, ...] = ()

    @classmethod
    def compile(cls, patterns: Iterable[str] | None, known: Iterable[SideRule] = ()) -> SideRules:
        compiled, reasons, reads = [], [], []
        named = [(p, f"pattern:{p}", Reads.FIRST) for p in patterns or ()]
        named += [(rule.pattern, f"known:{rule.name}", rule.reads) for rule in known]
        for pattern, reason, where in named:
            try:
                compiled.append(re.compile(pattern))
            except re.error as exc:
                raise PolicyError(f"bad side-conversation pattern {pattern!r}: {exc}") from None
            reasons.append(reason)
            reads.append(where)
        return cls(tuple(compiled), tuple(reasons), tuple(reads))

    def match(self, messages: Sequence[Message]) -> str | None:
        """Why the conversation is excluded: the reason of the first pattern that the message
        it reads matches, if any."""
        texts = {Reads.FIRST: _first_text(messages)}
        if Reads.LAST_USER in self.reads:
            texts[Reads.LAST_USER] = _last_user_text(messages)
        found = (
            reason
            for pattern, reason, where in zip(self.patterns, self.reasons, self.reads, strict=True)
            if pattern.search(texts[where])
        )
        return next(found, None)

    def __bool__(self) -> bool:
        return bool(self.patterns)


def exclusion(
    messages: Sequence[Message], rules: Iterable[SideRules], header: str | None = None
) -> str | None:
    """Why a turn is excluded from training (`header`, `pattern:<the pattern>` or
    `known:<the rule's name>`); None when it is not."""
    if header:
        return "header"
    for ruleset in rules:
        found = ruleset.match(messages)
        if found is not None:
            return found
    return None


def system_fingerprint(messages: Sequence[Message]) -> str | None:
    """16 hex digits of the SHA-256 of the system prompt; None without one."""
    if not messages or messages[0].get("role") != "system":
        return None
    return hashlib.sha256(_first_text(messages).encode()).hexdigest()[:16]


def subagent_prompts(nodes: Iterable[Node]) -> list[tuple[str, Node]]:
    """The prompts the generated turns among `nodes` (a session's tree, walked once by the
    caller) handed to sub-agents, with the turn that handed each one."""
    prompts: list[tuple[str, Node]] = []
    for node in nodes:
        message = node.message if node.turn is not None else None
        for call in (message or {}).get("tool_calls") or ():
            fn = call.get("function") or {}
            if fn.get("name") in SUBAGENT_TOOLS and isinstance(fn.get("arguments"), dict):
                prompts.extend(
                    (v.strip(), node)
                    for v in fn["arguments"].values()
                    if isinstance(v, str) and len(v.strip()) >= _MIN_PROMPT
                )
    return prompts


def conversation_tags(
    root: Node, leaf: Node, prompts: Sequence[tuple[str, Node]]
) -> ConversationTags:
    """The conversation a sample ending at `leaf` came from: `root_branch` (which of the
    tree's first messages it descends from, in order of arrival), `system_fingerprint`, and
    `subagent` (its first user message carries a prompt from `prompts` that a turn outside
    this conversation handed to a sub-agent)."""
    path = leaf.path()
    on_path = {id(n) for n in path}
    branch = next((i for i, c in enumerate(root.children) if path and c is path[0]), None)
    head: list[Message] = []
    first_user = ""
    for node in path:
        message = node.message
        if message is None:
            continue
        if not head:
            head.append(message)
        if message.get("role") == "user":
            first_user = str(message.get("content") or "")
            break
    return {
        "root_branch": branch,
        "system_fingerprint": system_fingerprint(head),
        "subagent": any(p in first_user for p, by in prompts if id(by) not in on_path),
    }
