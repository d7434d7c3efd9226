"""The first renders of a chat template, in a child process under a CPU-time and memory budget.

A template from `--chat-template` or a model directory is code: `{{ 'x' * 10**10 }}` allocates
without bound, two nested loops spin forever, and the server would do either at startup. So the
renders the server does at startup (the tool-call probes of `ChatTemplate` and the conversations
of `STARTUP_CONVERSATIONS`) run first in `python -m tokentrail.text.template_check` with
`RLIMIT_CPU` and `RLIMIT_AS` set, and a template that runs past either is refused with its name
and the limit (`TemplateBudgetExceeded`). A template that finishes inside the budget is then
rendered in the server as before, where the same renders of the same input cost the same. The
templates tokentrail ships are its own code, tested here, and are not run twice. There,
`probe_template` renders a one-message conversation at load, so a template that breaks on every
request fails at startup.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokentrail.errors import TemplateBudgetExceeded, TemplateError
from tokentrail.kinds import TemplateOutcome, parse_kind
from tokentrail.messages import Message, ToolSchema
from tokentrail.text.chat_template import ChatTemplate
from tokentrail.text.families import families

__all__ = [
    "BASIC_CONVERSATIONS",
    "DEFAULT_BUDGET",
    "STARTUP_CONVERSATIONS",
    "TemplateBudget",
    "check_within_budget",
    "probe_template",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TemplateBudget:
    """What a template's startup renders may use, beyond the child interpreter's own start.

    2 s of CPU is 40 times what the slowest shipped template (gpt-oss) takes for all of them,
    compiling included (49 ms); the limit counts whole seconds, so a spinning template is
    stopped after 2 to 3 s. 1 GiB of address space is 700 times their peak allocation (1.4 MiB
    traced). `wall_s` only backs up the CPU limit, for a child that is never scheduled.
    """

    cpu_s: int = 2
    memory_mib: int = 1024
    wall_s: float = 60.0

    def describe(self) -> str:
        return f"{self.cpu_s} s of CPU and {self.memory_mib} MiB of memory"


DEFAULT_BUDGET = TemplateBudget()

_PROBE_TOOL: ToolSchema = {
    "type": "function",
    "function": {
        "name": "Read",
        "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}

# A one-message conversation, and one with the system message a template may insist on:
# a template must render one of them (harnesses always send one).
BASIC_CONVERSATIONS: list[list[Message]] = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
]

# Shapes a harness sends; a template may refuse some on purpose (`raise_exception`: no system
# role, say), which is its right, but any other failure is worth a warning at startup.
STARTUP_CONVERSATIONS: dict[str, tuple[list[Message], list[ToolSchema] | None]] = {
    "system and tools": (
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        [_PROBE_TOOL],
    ),
    "tool call and result": (
        [
            {"role": "user", "content": "read a.py"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "look first",
                "tool_calls": [
                    {"type": "function", "function": {"name": "Read", "arguments": {"path": "a"}}}
                ],
            },
            {"role": "tool", "content": "x = 1"},
        ],
        [_PROBE_TOOL],
    ),
}


def check_within_budget(
    source: str,
    name: str,
    *,
    call_id: str = "call_{index}",
    variables: Mapping[str, str] | None = None,
    budget: TemplateBudget = DEFAULT_BUDGET,
) -> None:
    """Run `source`'s startup renders (with `variables`: the tokenizer's special tokens) in a
    child process under `budget`; `TemplateBudgetExceeded` naming `name` and the limit when they
    run past it. Whether the renders succeed is not judged here: the caller renders them next,
    inside the budget's guarantee, and reports a failure as it always has."""
    if source in _shipped_templates():
        return
    outcome, detail = _outcome(source, call_id, tuple(sorted((variables or {}).items())), budget)
    limit = f"the chat-template budget is {budget.describe()}"
    if outcome is TemplateOutcome.FINISHED:
        return
    if outcome is TemplateOutcome.OUT_OF_MEMORY:
        raise TemplateBudgetExceeded(
            f"{name} was refused: its startup renders needed more than {budget.memory_mib} MiB "
            f"of memory ({limit})"
        )
    if outcome is TemplateOutcome.OUT_OF_TIME:
        raise TemplateBudgetExceeded(
            f"{name} was refused: its startup renders used more than {budget.cpu_s} s of CPU "
            f"({detail}; {limit})"
        )
    if outcome is TemplateOutcome.OUT_OF_WALL_TIME:
        raise TemplateBudgetExceeded(
            f"{name} was refused: its startup renders did not finish within {budget.wall_s:g} s "
            f"({limit})"
        )
    raise TemplateError(f"{name} could not be checked: {detail}")


@functools.lru_cache(maxsize=64)
def _outcome(
    source: str, call_id: str, variables: tuple[tuple[str, str], ...], budget: TemplateBudget
) -> tuple[TemplateOutcome, str]:
    """How the startup renders of `source` end in a child under `budget`, and a detail."""
    job = {
        "source": source,
        "call_id": call_id,
        "variables": dict(variables),
        "cpu_s": budget.cpu_s,
        "memory_bytes": budget.memory_mib << 20,
    }
    started = time.monotonic()
    try:
        child = subprocess.run(
            [sys.executable, "-c", f"from {__name__} import main; main()"],
            input=json.dumps(job).encode(),
            capture_output=True,
            timeout=budget.wall_s,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
    except subprocess.TimeoutExpired:
        return TemplateOutcome.OUT_OF_WALL_TIME, ""
    report = child.stdout.decode("utf-8", "replace").strip().splitlines()
    if child.returncode == 0 and report:
        return parse_kind(
            TemplateOutcome, json.loads(report[-1])["outcome"], "template outcome"
        ), ""
    if child.returncode in (-signal.SIGXCPU, -signal.SIGKILL):  # the CPU limit's signals
        return TemplateOutcome.OUT_OF_TIME, f"stopped after {time.monotonic() - started:.1f} s"
    last = child.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
    return (
        TemplateOutcome.BROKEN,
        f"the checking process exited with status {child.returncode}: {last[0][:200]}",
    )


@functools.cache
def _shipped_templates() -> frozenset[str]:
    return frozenset(f.template() for f in families())


# --- the child ----------------------------------------------------------------------------------


Render = Callable[[Sequence[Message], Sequence[ToolSchema] | None], str]


def probe_template(render: Render, name: str = "the chat template") -> None:
    """Render a one-message conversation (or, for a template that insists on one, a system and
    a user message) and refuse to start when neither renders; log a warning for a shape that
    fails other than on purpose (`raise_exception`)."""
    failures: list[TemplateError] = []
    for messages in BASIC_CONVERSATIONS:
        try:
            render(messages, None)
            break
        except TemplateError as exc:
            failures.append(exc)
    else:
        raise TemplateError(
            f"{name} cannot render a one-message conversation, so every request would fail: "
            f"{failures[0]}"
        )
    for basic, failure in zip(BASIC_CONVERSATIONS, failures, strict=False):
        if failure.__cause__ is not None:  # not the template's own raise_exception
            logger.warning("%s fails on %d plain messages: %s", name, len(basic), failure)
    for shape, (messages, tools) in STARTUP_CONVERSATIONS.items():
        try:
            render(messages, tools)
        except TemplateError as exc:
            if exc.__cause__ is not None:  # not the template's own raise_exception
                logger.warning("%s fails on a conversation with %s: %s", name, shape, exc)


def _limit_self(cpu_s: int, memory_bytes: int) -> None:
    """Hold this process to `cpu_s` more seconds of CPU (SIGXCPU, then SIGKILL a second later)
    and `memory_bytes` more address space (allocations past it raise MemoryError); no core
    file for a template stopped by the CPU limit."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = math.ceil(used.ru_utime + used.ru_stime + cpu_s)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + memory_bytes, mapped + memory_bytes))


def _run_job(job: Mapping[str, Any]) -> TemplateOutcome:
    _limit_self(int(job["cpu_s"]), int(job["memory_bytes"]))
    variables = dict(job["variables"])
    try:
        template = ChatTemplate(job["source"], job["call_id"])
        shapes = [(m, None) for m in BASIC_CONVERSATIONS] + list(STARTUP_CONVERSATIONS.values())
        for messages, tools in shapes:
            try:
                template.render(messages, tools, **variables)
            except TemplateError as exc:
                if _memory_error(exc):
                    return TemplateOutcome.OUT_OF_MEMORY
    except MemoryError:
        return TemplateOutcome.OUT_OF_MEMORY
    except TemplateError as exc:
        if _memory_error(exc):
            return TemplateOutcome.OUT_OF_MEMORY
    return TemplateOutcome.FINISHED


def _memory_error(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, MemoryError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def main() -> None:
    """The child: read a job from stdin, render under its limits, say how it went."""
    outcome = _run_job(json.loads(sys.stdin.buffer.read()))
    print(json.dumps({"outcome": str(outcome)}), flush=True)
