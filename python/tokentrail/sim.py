"""Harness simulators: drive the adapter over HTTP the way real coding harnesses do.

A `HarnessSim` plays a coding session against a tokentrail adapter: it runs the tool calls the
model makes on an in-memory workspace and sends the history back, rewritten the way the
harness it imitates rewrites it (Claude Code 2.1.197 by default). Tests, the demo and the
benchmarks all drive sessions through it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

# Claude Code's file tools, with the schema default it fills in on echo (`replace_all`).
CLAUDE_CODE_TOOLS: list[dict[str, Any]] = [
    {
        "name": "Read",
        "description": "Read a file.",
        "input_schema": {
            "type": "object",
            "properties": {
                "file_path": {"type": "string"},
                "offset": {"type": "number"},
                "limit": {"type": "number"},
            },
            "required": ["file_path"],
            "additionalProperties": False,
        },
    },
    {
        "name": "Edit",
        "description": "Replace a string in a file.",
        "input_schema": {
            "type": "object",
            "properties": {
                "file_path": {"type": "string"},
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
                "replace_all": {"default": False, "type": "boolean"},
            },
            "required": ["file_path", "old_string", "new_string"],
            "additionalProperties": False,
        },
    },
    {
        "name": "Write",
        "description": "Write a file.",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["file_path", "content"],
            "additionalProperties": False,
        },
    },
    {
        "name": "Bash",
        "description": "Run a shell command.",
        "input_schema": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "description": {"type": "string"},
                "timeout": {"type": "number"},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
]

DEFAULT_WORKSPACE = {"calc.py": "def add(a, b):\n    return a+b   \n\nprint(add(1, 2))\n"}
SYSTEM_PROMPT = "You are a coding agent. Use the tools to change files in the workspace."
SYSTEM_NOTE = (
    "<system-reminder>Tool results are current; do not re-read edited files.</system-reminder>"
)


@dataclass
class Behaviour:
    """How the simulated harness rewrites what it sends back."""

    # Claude Code 2.1.197: fill schema defaults, right-strip lines of Edit/Write payloads.
    rerender_echoes: bool = True
    # Claude Code moves its `cache_control` breakpoint to the newest message every request.
    move_cache_control: bool = True
    # Claude Code sends `role: system` notes in the middle of the message list.
    system_notes: bool = True


def rstrip_lines(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.split("\n"))


def rerender_tool_input(
    name: str, args: dict[str, Any], tools: list[dict[str, Any]]
) -> dict[str, Any]:
    """The input as Claude Code 2.1.197 runs and replays it.

    Defaults the schema declares are filled in (first, as the CLI orders them); each line of an
    Edit's `new_string`, and of a Write's `content` unless the file is Markdown, is right-stripped.
    """
    schema = next((t["input_schema"] for t in tools if t["name"] == name), {})
    filled = {
        key: prop["default"]
        for key, prop in schema.get("properties", {}).items()
        if "default" in prop and key not in args
    }
    out = {**copy.deepcopy(filled), **copy.deepcopy(args)}
    if name == "Edit" and isinstance(out.get("new_string"), str):
        out["new_string"] = rstrip_lines(out["new_string"])
    if name == "Write" and isinstance(out.get("content"), str):
        if not str(out.get("file_path", "")).endswith(".md"):
            out["content"] = rstrip_lines(out["content"])
    return out


@dataclass
class Workspace:
    """Files the simulated tools read and write."""

    files: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_WORKSPACE))

    def run(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        """Run one tool call; return its result text and whether it failed."""
        path = str(args.get("file_path", ""))
        if name == "Read":
            if path not in self.files:
                return f"File does not exist: {path}", True
            lines = self.files[path].split("\n")
            return "\n".join(f"{n + 1}\t{line}" for n, line in enumerate(lines)), False
        if name == "Edit":
            text = self.files.get(path)
            old, new = args.get("old_string", ""), args.get("new_string", "")
            if text is None or old not in text:
                return f"String to replace not found in file: {path}", True
            count = -1 if args.get("replace_all") else 1
            self.files[path] = text.replace(old, new, count)
            return f"The file {path} has been updated successfully.", False
        if name == "Write":
            self.files[path] = str(args.get("content", ""))
            return f"File created successfully at: {path}", False
        if name == "Bash":
            return f"$ {args.get('command', '')}\n(exit 0)", False
        return f"No such tool: {name}", True


@dataclass
class SimResult:
    requests: int = 0
    tool_calls: dict[str, int] = field(default_factory=dict)
    rewritten_echoes: int = 0
    final_text: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)


class HarnessSim:
    """A Claude-Code-like harness speaking the Anthropic Messages API to an adapter."""

    def __init__(
        self,
        base_url: str,
        session_id: str,
        *,
        behaviour: Behaviour | None = None,
        tools: list[dict[str, Any]] | None = None,
        workspace: Workspace | None = None,
        max_requests: int = 64,
        max_tokens: int = 2048,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.session_id = session_id
        self.behaviour = behaviour or Behaviour()
        self.tools = tools if tools is not None else CLAUDE_CODE_TOOLS
        self.workspace = workspace or Workspace()
        self.max_requests = max_requests
        self.max_tokens = max_tokens

    def _body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        wire = copy.deepcopy(messages)
        if self.behaviour.move_cache_control:
            last = wire[-1]
            if isinstance(last["content"], list) and last["content"]:
                last["content"][-1]["cache_control"] = {"type": "ephemeral"}
        return {
            "model": "tokentrail",
            "max_tokens": self.max_tokens,
            "system": [{"type": "text", "text": SYSTEM_PROMPT}],
            "messages": wire,
            "tools": self.tools,
            "stream": False,
        }

    async def run(self, task: str, http: aiohttp.ClientSession | None = None) -> SimResult:
        own = http is None
        http = http or aiohttp.ClientSession()
        try:
            return await self._run(task, http)
        finally:
            if own:
                await http.close()

    async def _run(self, task: str, http: aiohttp.ClientSession) -> SimResult:
        result = SimResult()
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "text", "text": task}]}
        ]
        if self.behaviour.system_notes:
            messages.append({"role": "system", "content": SYSTEM_NOTE})
        headers = {"Authorization": f"Bearer {self.session_id}", "anthropic-version": "2023-06-01"}
        for _ in range(self.max_requests):
            async with http.post(
                f"{self.base_url}/v1/messages?beta=true", json=self._body(messages), headers=headers
            ) as resp:
                payload = await resp.json()
                if resp.status != 200:
                    raise RuntimeError(f"adapter answered {resp.status}: {payload}")
            result.requests += 1
            content = payload["content"]
            echoed, results = [], []
            for block in content:
                block = copy.deepcopy(block)
                if block["type"] == "tool_use":
                    name = block["name"]
                    result.tool_calls[name] = result.tool_calls.get(name, 0) + 1
                    if self.behaviour.rerender_echoes:
                        rewritten = rerender_tool_input(name, block["input"], self.tools)
                        result.rewritten_echoes += rewritten != block["input"]
                        block["input"] = rewritten
                    text, failed = self.workspace.run(name, block["input"])
                    tool_result = {
                        "type": "tool_result",
                        "tool_use_id": block["id"],
                        "content": text,
                    }
                    if failed:
                        tool_result["is_error"] = True
                    results.append(tool_result)
                echoed.append(block)
            messages.append({"role": "assistant", "content": echoed})
            if not results:
                result.final_text = "".join(
                    b.get("text", "") for b in content if b["type"] == "text"
                )
                break
            messages.append({"role": "user", "content": results})
        result.messages = messages
        return result


def transcript_json(result: SimResult) -> str:
    return json.dumps(result.messages, indent=2, ensure_ascii=False)
