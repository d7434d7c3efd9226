"""A simulated coding model: replies are a deterministic function of the conversation.

Its plan comes from a `<sim-plan seed=S steps=N .../>` marker that `sim.harness` puts in the system
prompt: N tool calls (Read/Edit/Write/Bash, an `Agent` call at `agent_at`), then a final
answer; `[verify]` nudges get a short verification reply, `[compact]` requests a summary. A
retried prompt gets a different reply, as sampling would give.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokentrail.engines.base import GenerateRequest
from tokentrail.engines.registry import register_engine
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.text.families import Family, count_calls
from tokentrail.text.tokenizer import LoadedTokenizer

PLAN_RE = re.compile(r"<sim-plan ([^>]*?)\s*/>")
PROGRESS_RE = re.compile(r"\[progress: (\d+) steps\]")
VERIFY_TAG = "[verify]"
COMPACT_TAG = "[compact]"
WORDS = (
    "module parser config cache tests handler retry buffer schema index client server token "
    "session branch result value error update refactor check"
).split()


@dataclass(frozen=True)
class Plan:
    seed: int = 0
    steps: int = 4
    answer_words: int = 80
    think: float = 0.5
    # The steps whose tool call is an `Agent` call (a sub-agent), none by default.
    agent_at: tuple[int, ...] = ()
    files: int = 4
    # How often a tool call is written as compact JSON rather than the template's spacing,
    # as real models sometimes do: a re-render then no longer reproduces the sampled tokens.
    compact: float = 0.3

    def marker(self) -> str:
        return (
            f"<sim-plan seed={self.seed} steps={self.steps} answer_words={self.answer_words} "
            f"think={self.think} agent_at={','.join(map(str, self.agent_at)) or -1} "
            f"files={self.files} "
            f"compact={self.compact}/>"
        )

    @classmethod
    def parse(cls, text: str) -> Plan | None:
        found = PLAN_RE.search(text)
        if found is None:
            return None
        fields = dict(item.split("=", 1) for item in found.group(1).split())
        return cls(
            seed=int(fields.get("seed", 0)),
            steps=int(fields.get("steps", 4)),
            answer_words=int(fields.get("answer_words", 80)),
            think=float(fields.get("think", 0.5)),
            agent_at=tuple(int(k) for k in fields.get("agent_at", "-1").split(",") if int(k) >= 0),
            files=int(fields.get("files", 4)),
            compact=float(fields.get("compact", 0.3)),
        )


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def sim_file(j: int) -> str:
    return f"src/m{j}.py"


def progress(messages: Sequence[Mapping[str, Any]]) -> int:
    """Steps done: those a compaction summary reports, plus tool calls since."""
    done = 0
    for m in messages:
        if m.get("role") == "user":
            found = PROGRESS_RE.search(_text(m))
            if found:
                done = int(found.group(1))
                break
    return done + sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def tool_step(plan: Plan, k: int, rng: random.Random) -> dict[str, Any]:
    """The tool call of step `k`: payloads carry trailing whitespace a harness may strip."""
    if k in plan.agent_at:
        return {
            "type": "tool_use",
            "name": "Agent",
            "input": {"description": "survey", "prompt": f"Survey {sim_file(k % plan.files)}."},
        }
    path = sim_file(rng.randrange(plan.files))
    kind = rng.choice(("Read", "Edit", "Write", "Bash"))
    if kind == "Read":
        args: dict[str, Any] = {"file_path": path}
    elif kind == "Edit":
        args = {
            "file_path": path,
            "old_string": "    pass\n",
            "new_string": f"    # step {k}   \n    return {rng.randrange(100)}\n",
        }
    elif kind == "Write":
        target = path if rng.random() < 0.8 else f"docs/step{k}.md"
        body = "".join(f"def f{j}():  \n    pass\n" for j in range(rng.randrange(2, 6)))
        args = {"file_path": target, "content": body}
    else:
        args = {
            "command": f"pytest -q tests/test_m{rng.randrange(plan.files)}.py",
            "description": "Run the tests",
        }
    return {"type": "tool_use", "name": kind, "input": args}


def _plan(messages: Sequence[Mapping[str, Any]]) -> Plan:
    system = next((_text(m) for m in messages if m.get("role") == "system"), "")
    return Plan.parse(system) or Plan()


class SimulatedEngine(ScriptedEngine):
    """Plays the plan in the conversation's system prompt; see the module docstring."""

    name = "simulated"

    def __init__(
        self, tokenizer: LoadedTokenizer, family: Family | None = None, seed: int | None = None
    ) -> None:
        super().__init__(tokenizer, script=[], family=family)
        self._attempts: Counter[tuple[int, ...]] = Counter()
        # A sampling seed of its own: rollouts of one plan (a GRPO group's) then differ, as
        # an engine sampling at a temperature makes them; None plays the plan alone.
        self._seed = "" if seed is None else f"{seed}:"

    def write(self, message: Mapping[str, Any], req: GenerateRequest) -> str:
        plan = _plan(req.messages)
        rng = random.Random(f"compact:{plan.seed}:{len(req.input_ids)}")
        # Some calls come out as compact JSON, which a re-render does not reproduce.
        compact = bool(message.get("tool_calls")) and rng.random() < plan.compact
        calls = count_calls(req.messages)
        return self.family.format_output(message, call_index=calls, compact=compact)

    def choose(self, req: GenerateRequest) -> list[dict[str, Any]]:
        messages = req.messages
        plan = _plan(messages)
        key = tuple(req.input_ids[-64:]) + (len(req.input_ids),)
        attempt = self._attempts[key]
        self._attempts[key] += 1
        done = progress(messages)
        rng = random.Random(f"{self._seed}{plan.seed}:{done}:{attempt}:{len(messages)}")
        last = _text(messages[-1]) if messages else ""
        blocks: list[dict[str, Any]] = []
        if rng.random() < plan.think:
            blocks.append({"type": "thinking", "thinking": _sentence(rng, rng.randrange(6, 24))})
        if VERIFY_TAG in last:
            blocks.append({"type": "text", "text": "Verified: " + _sentence(rng, 6)})
        elif COMPACT_TAG in last:
            blocks = [
                {"type": "text", "text": f"Summary after {done} steps: " + _sentence(rng, 12)}
            ]
        elif done < plan.steps:
            if rng.random() < 0.5:
                blocks.append({"type": "text", "text": _sentence(rng, rng.randrange(3, 10))})
            blocks.append(tool_step(plan, done, rng))
        else:
            blocks.append({"type": "text", "text": _sentence(rng, plan.answer_words)})
        return blocks


@register_engine("simulated", "simulated")
def _from_spec(
    spec: str, address: str, tokenizer: LoadedTokenizer, timeout: float
) -> SimulatedEngine:
    return SimulatedEngine(tokenizer)
