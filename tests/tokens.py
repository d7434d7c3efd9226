"""Readable token fixtures: every message renders to `[START, role, body..., END]`.

Each role has its own id band, so a failing assertion shows at a glance whose tokens are where:
system 100s, user 200s, assistant 300s, tool 400s. A prompt ends with the generation prompt
`[START, ASSISTANT]`; a reply is sampled as `body + [END]`, so a clean next prompt re-renders it
exactly.
"""

from __future__ import annotations

import json
from typing import Any

from tokentrail import TrajectoryManager, TurnRecord

START, END = 1, 2
BAND = {"system": 100, "user": 200, "assistant": 300, "tool": 400}
ASSISTANT = BAND["assistant"]
LOGPROB = -0.5


def body(message: dict[str, Any]) -> list[int]:
    band = BAND[message["role"]]
    text = message.get("content") or ""
    for call in message.get("tool_calls") or ():
        text += json.dumps(call["function"], sort_keys=True)
    return [band + 1 + (ord(ch) % 97) for ch in text]


def render(message: dict[str, Any]) -> list[int]:
    return [START, BAND[message["role"]], *body(message), END]


def prompt_ids(messages: list[dict[str, Any]]) -> list[int]:
    ids: list[int] = []
    for m in messages:
        ids += render(m)
    return ids + [START, ASSISTANT]


def sampled(reply: dict[str, Any]) -> list[int]:
    """What the model emits for `reply` after the generation prompt."""
    return [*body(reply), END]


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str = "", *calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = [
            {"type": "function", "function": {"name": name, "arguments": args}}
            for name, args in calls
        ]
    return msg


def tool(text: str) -> dict[str, Any]:
    return {"role": "tool", "content": text}


def play(
    manager: TrajectoryManager,
    sid: str,
    messages: list[dict[str, Any]],
    reply: dict[str, Any],
    *,
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    logprobs: list[float] | None = None,
) -> list[int]:
    """Record one turn the way an adapter would; return the output ids."""
    prompt = prompt_ids(messages) if prompt is None else prompt
    output = sampled(reply) if output is None else output
    lps = [LOGPROB] * len(output) if logprobs is None else logprobs
    manager.record_turn(
        sid,
        turn=TurnRecord(prompt, output, "stop", lps),
        prompt_messages=messages,
        response_message=reply,
    )
    return output
