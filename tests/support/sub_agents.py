"""A scripted engine for a harness run with a sub-agent, and the `cd`-prefixed shell calls the
real-harness tests script (a harness running in its own directory rewrites them in its echo)."""

from __future__ import annotations

from pathlib import Path

from tokentrail.engines.base import GenerateRequest
from tokentrail.engines.scripted import FINAL_REPLY, ScriptedEngine
from tokentrail.text.tokenizer import LoadedTokenizer


class SubAgentScript(ScriptedEngine):
    """The scripted engine with a second script for the sub-agent's conversation, the one whose
    first user message holds `sub_prompt` (a script answers by the prompt's assistant count,
    which both conversations start at 0)."""

    def __init__(self, tokenizer: LoadedTokenizer, main: list, sub: list, sub_prompt: str) -> None:
        super().__init__(tokenizer, main)
        self.sub = sub
        self.sub_prompt = sub_prompt

    def choose(self, req: GenerateRequest) -> list[dict]:
        first = next((m for m in req.messages if m.get("role") == "user"), {})
        replies = self.sub if self.sub_prompt in str(first.get("content")) else self.replies
        index = self.reply_index(req.messages)
        return replies[index] if index < len(replies) else FINAL_REPLY


def cd_call(repo: Path, command: str, tool: str) -> dict:
    """A `tool_use` of shell tool `tool` running `command` after a `cd` into `repo`."""
    return {
        "type": "tool_use",
        "name": tool,
        "input": {"command": f"cd {repo} && {command}", "description": command[:40]},
    }
