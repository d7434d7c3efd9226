"""Harness simulators: drive the adapter over HTTP the way real coding harnesses do.

A `HarnessSim` plays a coding session against a tokentrail adapter (Anthropic or OpenAI
protocol): it runs the model's tool calls on an in-memory workspace and sends the history back
rewritten the way real harnesses rewrite it, each rewrite a switch of `Behaviour`: Claude Code
2.1.197's echo re-rendering, a verify-on-stop loop that strips its nudge and merges assistant
messages, sub-agents, compaction, retries, reasoning stripped from earlier turns. A session is
reproducible from its `SessionSpec` (seed, steps, context size).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field, fields
from typing import Any

import aiohttp

from tokentrail.adapter.turn.answers import RETRY_HEADER
from tokentrail.core.routing import RoutingShape
from tokentrail.kinds import Retry, parse_kind
from tokentrail.sim.model import COMPACT_TAG, VERIFY_TAG, Plan, sim_file
from tokentrail.sim.wire import from_openai, from_responses, to_openai, to_responses, wire_tools
from tokentrail.trajectory.linearize import Trajectory

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
    {
        "name": "Agent",
        "description": "Run a sub-agent on a task and return its report.",
        "input_schema": {
            "type": "object",
            "properties": {"description": {"type": "string"}, "prompt": {"type": "string"}},
            "required": ["description", "prompt"],
            "additionalProperties": False,
        },
    },
]

DEFAULT_WORKSPACE = {"calc.py": "def add(a, b):\n    return a+b   \n\nprint(add(1, 2))\n"}
SYSTEM_PROMPT = "You are a coding agent. Use the tools to change files in the workspace."
SYSTEM_NOTE = (
    "<system-reminder>Tool results are current; do not re-read edited files.</system-reminder>"
)
NUDGE = f"{VERIFY_TAG} Before you stop, verify that the changes are complete."
COMPACT_REQUEST = f"{COMPACT_TAG} Summarize the work so far for a fresh context."


@dataclass(frozen=True)
class Behaviour:
    """How the simulated harness rewrites what it sends back. Every field is a switch."""

    # Claude Code 2.1.197: fill schema defaults, right-strip lines of Edit/Write payloads.
    rerender_echoes: bool = True
    # Claude Code moves its `cache_control` breakpoint to the newest message every request.
    move_cache_control: bool = True
    # Claude Code sends `role: system` notes in the middle of the message list.
    system_notes: bool = True
    # When the agent stops, nudge it to verify ("user" or "system" role) and ask again.
    verify_on_stop: bool = False
    nudge_role: str = "user"
    # Strip the nudge from the persisted transcript and merge the two assistant messages.
    strip_nudge: bool = False
    # The old loop's bug: the agent's full answer is dropped, only the short reply is kept.
    drop_full_answer: bool = False
    # The model's `Agent` call runs a sub-agent conversation under the same session id.
    subagents: bool = False
    # Halfway through, replace the history with a summary the model writes.
    compaction: bool = False
    # Drop one response (as a client timeout would) and send the same request again.
    retries: bool = False
    # That resent request asks for a fresh sample (`X-Tokentrail-Retry: fresh`).
    fresh_retries: bool = False
    # Send earlier assistant turns without their thinking blocks.
    strip_reasoning: bool = False

    @classmethod
    def switches(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.type in ("bool", bool)]


@dataclass(frozen=True)
class SessionSpec:
    """A reproducible session: the model's plan and how big its context grows."""

    seed: int = 0
    steps: int = 6
    tasks: int = 1
    context_tokens: int = 4000
    think: float = 0.5
    answer_words: int = 60
    files: int = 4
    # How many of the main conversation's steps call a sub-agent (with `Behaviour.subagents`).
    subagents: int = 1

    def plan(self, *, agent: bool, seed_offset: int = 0, steps: int | None = None) -> Plan:
        agent_at: tuple[int, ...] = ()
        if agent and self.steps > 1:
            rng = random.Random(self.seed)
            # The first draw is the one-sub-agent session's step, so those sessions stay as
            # they were; further ones are other steps.
            first = rng.randrange(1, self.steps)
            rest = [k for k in range(1, self.steps) if k != first]
            extra = rng.sample(rest, min(len(rest), max(0, self.subagents - 1)))
            agent_at = (first, *sorted(extra))
        return Plan(
            seed=self.seed + seed_offset,
            steps=self.steps if steps is None else steps,
            answer_words=self.answer_words,
            think=self.think,
            agent_at=agent_at,
            files=self.files,
        )

    def workspace(self) -> Workspace:
        # Every tool result is about the same size, so the context reaches about
        # `context_tokens` over the session's steps (the padding lines tokenize at about two
        # characters a token with the Qwen vocabulary).
        per_step = max(64, 2 * self.context_tokens // max(1, self.steps))
        files = {sim_file(j): "def f():\n" + "    pass\n" * 32 for j in range(self.files)}
        return Workspace(files, result_chars=per_step)


def rstrip_lines(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.split("\n"))


def rerender_tool_input(
    name: str, args: dict[str, Any], tools: list[dict[str, Any]]
) -> dict[str, Any]:
    """The input as Claude Code 2.1.197 runs and replays it.

    Defaults the schema declares are filled in (first, as the CLI orders them); each line of an
    Edit's `new_string`, and of a Write's `content` unless the file is Markdown, is right-stripped.
    """
    schema: dict[str, Any] = next(
        (t.get("input_schema", {}) for t in tools if t["name"] == name), {}
    )
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
    # Pad each result with a numbered listing (as Claude Code's snippets and logs are) up to
    # this many characters; 0 leaves results as the tool wrote them.
    result_chars: int = 0

    def run(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        """Run one tool call; return its result text and whether it failed."""
        text, failed = self._run(name, args)
        n = 1
        while len(text) < self.result_chars:
            text += f"\n{n:>6}\tlog line {n} of {name}: ok"
            n += 1
        return text, failed

    def _run(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
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
    dropped_responses: int = 0
    subagent_runs: int = 0
    compactions: int = 0
    final_text: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)


# -- the harness --------------------------------------------------------------------------------


class HarnessSim:
    """A coding harness speaking the Anthropic (default), OpenAI Chat Completions or OpenAI
    Responses API to an adapter."""

    def __init__(
        self,
        base_url: str,
        session_id: str,
        *,
        behaviour: Behaviour | None = None,
        spec: SessionSpec | None = None,
        protocol: str = "anthropic",
        tools: list[dict[str, Any]] | None = None,
        workspace: Workspace | None = None,
        max_requests: int = 256,
        max_tokens: int = 4096,
    ) -> None:
        if protocol not in ("anthropic", "openai", "responses"):
            raise ValueError(f"unknown protocol {protocol!r}")
        self.base_url = base_url.rstrip("/")
        self.session_id = session_id
        self.behaviour = behaviour or Behaviour()
        self.spec = spec or SessionSpec()
        self.protocol = protocol
        self.tools = tools if tools is not None else CLAUDE_CODE_TOOLS
        self.workspace = workspace or self.spec.workspace()
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self._rng = random.Random(f"harness:{self.spec.seed}")
        self._result = SimResult()
        self._compacted = False
        self._retried = False

    async def run(self, task: str, http: aiohttp.ClientSession | None = None) -> SimResult:
        """Play the session: `task`, then `spec.tasks - 1` follow-ups."""
        own = http is None
        http = http or aiohttp.ClientSession()
        try:
            plan = self.spec.plan(agent=self.behaviour.subagents)
            system = f"{SYSTEM_PROMPT}\n{plan.marker()}"
            messages: list[dict[str, Any]] = []
            for t in range(self.spec.tasks):
                text = task if t == 0 else f"Follow-up {t}: tidy up what you changed."
                messages.append({"role": "user", "content": [{"type": "text", "text": text}]})
                if t == 0 and self.behaviour.system_notes:
                    messages.append({"role": "system", "content": SYSTEM_NOTE})
                messages = await self._agent_loop(http, system, messages, main=True)
            self._result.messages = messages
            return self._result
        finally:
            if own:
                await http.close()

    async def _agent_loop(
        self,
        http: aiohttp.ClientSession,
        system: str,
        messages: list[dict[str, Any]],
        *,
        main: bool,
    ) -> list[dict[str, Any]]:
        b = self.behaviour
        verified = False
        while self._result.requests < self.max_requests:
            if (
                main
                and b.compaction
                and not self._compacted
                and self._steps(messages) >= max(1, self.spec.steps // 2)
            ):
                messages = await self._compact(http, system, messages)
            content = await self._request(http, system, messages)
            if b.retries and main and not self._retried and self._steps(messages) >= 1:
                # The harness lost this response (a client-side timeout) and asks again.
                self._retried = True
                self._result.dropped_responses += 1
                content = await self._request(http, system, messages, fresh=b.fresh_retries)
            echoed, results = await self._run_tools(http, content)
            if results:
                messages += [
                    {"role": "assistant", "content": echoed},
                    {"role": "user", "content": results},
                ]
                continue
            answer = {"role": "assistant", "content": echoed}
            self._result.final_text = "".join(
                blk.get("text", "") for blk in content if blk["type"] == "text"
            )
            if not (main and b.verify_on_stop) or verified:
                return [*messages, answer]
            nudge: dict[str, Any] = {"role": b.nudge_role, "content": NUDGE}
            if b.nudge_role == "user":
                nudge["content"] = [{"type": "text", "text": NUDGE}]
            messages = [*messages, answer, nudge]
            reply = await self._request(http, system, messages)
            verify = {"role": "assistant", "content": reply}
            verified = True
            if b.strip_nudge:
                base = messages[:-2]
                kept = [] if b.drop_full_answer else list(answer["content"])
                merged = {"role": "assistant", "content": kept + list(verify["content"])}
                return [*base, merged]
            return [*messages, verify]
        return messages

    @staticmethod
    def _steps(messages: list[dict[str, Any]]) -> int:
        return sum(
            1
            for m in messages
            if m["role"] == "assistant" and any(blk["type"] == "tool_use" for blk in m["content"])
        )

    async def _compact(
        self, http: aiohttp.ClientSession, system: str, messages: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        self._compacted = True
        self._result.compactions += 1
        ask = [*messages, {"role": "user", "content": [{"type": "text", "text": COMPACT_REQUEST}]}]
        summary = "".join(
            b.get("text", "") for b in await self._request(http, system, ask) if b["type"] == "text"
        )
        first = messages[0]["content"][0]["text"]
        done = self._steps(messages)
        text = f"{first}\n\n[progress: {done} steps] {summary}"
        return [{"role": "user", "content": [{"type": "text", "text": text}]}]

    async def _run_tools(
        self, http: aiohttp.ClientSession, content: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        echoed, results = [], []
        for block in content:
            block = copy.deepcopy(block)
            if block["type"] == "tool_use":
                name = block["name"]
                self._result.tool_calls[name] = self._result.tool_calls.get(name, 0) + 1
                if self.behaviour.rerender_echoes:
                    rewritten = rerender_tool_input(name, block["input"], self.tools)
                    if rewritten != block["input"]:
                        self._result.rewritten_echoes += 1
                        block.pop("arguments", None)  # the wire text no longer says this
                    block["input"] = rewritten
                if name == "Agent" and self.behaviour.subagents:
                    text, failed = await self._subagent(http, block["input"]), False
                else:
                    text, failed = self.workspace.run(name, block["input"])
                tool_result: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": block["id"],
                    "content": text,
                }
                if failed:
                    tool_result["is_error"] = True
                results.append(tool_result)
            echoed.append(block)
        return echoed, results

    async def _subagent(self, http: aiohttp.ClientSession, args: dict[str, Any]) -> str:
        self._result.subagent_runs += 1
        plan = self.spec.plan(agent=False, seed_offset=1000 + self._result.subagent_runs, steps=2)
        system = f"You are a sub-agent. Report back briefly.\n{plan.marker()}"
        messages = [{"role": "user", "content": [{"type": "text", "text": str(args["prompt"])}]}]
        final = await self._agent_loop(http, system, messages, main=False)
        return "".join(b.get("text", "") for b in final[-1]["content"] if b["type"] == "text")

    def _wire_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        wire = copy.deepcopy(messages)
        if self.behaviour.strip_reasoning:
            last = max((i for i, m in enumerate(wire) if m["role"] == "assistant"), default=-1)
            for i, m in enumerate(wire):
                if m["role"] == "assistant" and i != last:
                    m["content"] = [b for b in m["content"] if b["type"] != "thinking"]
        if self.behaviour.move_cache_control:
            last_msg = wire[-1]
            if isinstance(last_msg["content"], list) and last_msg["content"]:
                last_msg["content"][-1]["cache_control"] = {"type": "ephemeral"}
        return wire

    async def _request(
        self,
        http: aiohttp.ClientSession,
        system: str,
        messages: list[dict[str, Any]],
        *,
        fresh: bool = False,
    ) -> list[dict[str, Any]]:
        self._result.requests += 1
        wire = self._wire_messages(messages)
        headers = {"Authorization": f"Bearer {self.session_id}"}
        if fresh:
            headers[RETRY_HEADER] = Retry.FRESH.value
        if self.protocol == "anthropic":
            url = f"{self.base_url}/v1/messages?beta=true"
            body: dict[str, Any] = {
                "model": "tokentrail",
                "max_tokens": self.max_tokens,
                "system": [{"type": "text", "text": system}],
                "messages": wire,
                "tools": self.tools,
            }
            headers["anthropic-version"] = "2023-06-01"
        else:
            for m in wire:
                if isinstance(m["content"], list):
                    for blk in m["content"]:
                        blk.pop("cache_control", None)
            if self.protocol == "openai":
                url = f"{self.base_url}/v1/chat/completions"
                body = {
                    "model": "tokentrail",
                    "max_tokens": self.max_tokens,
                    "messages": to_openai(system, wire),
                    "tools": wire_tools(self.tools, "openai"),
                }
            else:
                url = f"{self.base_url}/v1/responses"
                body = {
                    "model": "tokentrail",
                    "max_output_tokens": self.max_tokens,
                    "input": to_responses(system, wire),
                    "tools": wire_tools(self.tools, "responses"),
                    "store": False,
                    "include": ["reasoning.encrypted_content"],
                }
        async with http.post(url, json=body, headers=headers) as resp:
            payload = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"adapter answered {resp.status}: {payload}")
        if self.protocol == "anthropic":
            return list(payload["content"])
        return from_openai(payload) if self.protocol == "openai" else from_responses(payload)


@dataclass
class SimRun:
    """One simulated session end to end: what the harness did and what it trains."""

    result: SimResult
    trajectory: Trajectory


async def simulate(
    tokenizer: Any,
    *,
    behaviour: Behaviour | None = None,
    spec: SessionSpec | None = None,
    protocol: str = "anthropic",
    restore: str = "on",
    rewrite_policy: str = "merge",
    engine: Any = None,
    history: str = "splice",
    chat_template: str | None = None,
    task: str = "Refactor the modules and keep the tests green.",
    request_memo: int = 256,
    routing: RoutingShape | None = None,
    journal: Any = None,
    session_id: str = "sim",
    group: str | None = None,
) -> SimRun:
    """Serve an adapter over the simulated model on loopback, play one session (opened in
    `group`, when given), finish it. With `routing`, the adapter asks the engine for routed
    experts of that shape."""
    from tokentrail.adapter import Adapter, AdapterConfig, start_server
    from tokentrail.adapter.config import SessionSettings
    from tokentrail.kinds import History, Restore
    from tokentrail.sim.model import SimulatedEngine
    from tokentrail.text.families import resolve_family
    from tokentrail.trajectory.manager import TrajectoryManager

    family = resolve_family(tokenizer, chat_template)
    adapter = Adapter(
        engine=engine or SimulatedEngine(tokenizer, family),
        tokenizer=tokenizer,
        chat_template=chat_template,
        manager=TrajectoryManager(rewrite_policy=rewrite_policy, routing=routing),
        config=AdapterConfig(
            restore=parse_kind(Restore, restore, "restore mode"),
            history=parse_kind(History, history, "history mode"),
            request_memo=request_memo,
            routed_experts=routing is not None,
        ),
        journal=journal,
    )
    runner, url = await start_server(adapter)
    try:
        if group is not None:
            adapter.open_session(session_id, SessionSettings(group=group))
        sim = HarnessSim(url, session_id, behaviour=behaviour, spec=spec, protocol=protocol)
        result = await sim.run(task)
        trajectory = await adapter.finish_trajectory(session_id, reward=1.0)
    finally:
        await runner.cleanup()
    return SimRun(result, trajectory)
