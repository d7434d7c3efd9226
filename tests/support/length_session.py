"""A session whose turns end at `length`, as a model's do when `max_tokens` cuts them.

`PiecesEngine` is the scripted engine sampling its script's text in `piece`-character pieces,
each encoded alone: the text a model writes, in ids that are not the ones encoding the text
gives (as sampled tokens often are not), so a re-render of a turn does not give its ids back.
`length_session` runs `LENGTH_SCRIPT` through the adapter over the official Anthropic SDK with a
small `max_tokens`: replies cut mid-word, mid-call and mid-thought, each sent back as the
harness got it with "continue" (or a tool result), then the session's trajectory.
"""

from __future__ import annotations

from typing import Any

import anthropic

from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.engines.base import GenerateRequest, Generation
from tokentrail.engines.scripted import ScriptedEngine, scripted_logprob
from tokentrail.kinds import History
from tokentrail.trajectory.linearize import Trajectory
from tokentrail.trajectory.manager import TrajectoryManager

LONG = "The quick brown fox jumps over the lazy dog while the cat watches from the sill. " * 3
LENGTH_SCRIPT: list[list[dict[str, Any]]] = [
    [{"type": "text", "text": LONG}],
    [{"type": "tool_use", "name": "Read", "input": {"file_path": "src/deeply/nested/a.py"}}],
    [
        {"type": "thinking", "thinking": "I should look at this for a long while first. " * 3},
        {"type": "text", "text": "ok"},
    ],
    [{"type": "text", "text": "Short."}],
    [{"type": "tool_use", "name": "Read", "input": {"file_path": "b.py"}}],
    [{"type": "tool_use", "name": "Read", "input": {"file_path": "src/another/long/path.py"}}],
    [{"type": "text", "text": LONG}],
]
READ = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
}


class PiecesEngine(ScriptedEngine):
    """The scripted engine, its text sampled in pieces (see the module docstring)."""

    piece = 3

    async def generate(self, req: GenerateRequest) -> Generation:
        message = self.message_for(req)
        text = self.write(message, req)
        ids = [
            t
            for i in range(0, len(text), self.piece)
            for t in self.tokenizer.encode(text[i : i + self.piece])
        ]
        ids.append(self.end_id(message))
        finish = "stop"
        if len(ids) > req.sampling.max_new_tokens:
            ids, finish = ids[: req.sampling.max_new_tokens], "length"
        logprobs = [scripted_logprob(t, i) for i, t in enumerate(ids)]
        routed, indexer = req.replay.unsupported()
        return Generation(ids, logprobs, finish, len(req.input_ids), 0.0, routed, indexer)


async def length_session(
    tokenizer: Any,
    *,
    max_tokens: int = 40,
    history: str = "splice",
    engine: ScriptedEngine | None = None,
    manager: TrajectoryManager | None = None,
) -> tuple[Trajectory, list[str]]:
    """The trajectory of one `LENGTH_SCRIPT` session, and each reply's stop reason."""
    adapter = Adapter(
        engine=engine or PiecesEngine(tokenizer, LENGTH_SCRIPT),
        tokenizer=tokenizer,
        manager=manager,
        config=AdapterConfig(history=History(history)),
    )
    runner, url = await start_server(adapter)
    client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "go"}]
    stops = []
    try:
        async with client:
            await _turns(client, messages, stops, max_tokens)
        trajectory = await adapter.finish_trajectory("s")
    finally:
        await runner.cleanup()
    return trajectory, stops


async def _turns(
    client: anthropic.AsyncAnthropic, messages: list[Any], stops: list[str], max_tokens: int
) -> None:
    for _ in LENGTH_SCRIPT:
        reply = await client.messages.create(
            model="m", max_tokens=max_tokens, tools=[READ], messages=messages
        )
        stops.append(str(reply.stop_reason))
        content = [b.model_dump(exclude_none=True) for b in reply.content]
        messages.append({"role": "assistant", "content": content})
        calls = [b for b in reply.content if b.type == "tool_use"]
        if calls:
            results = [
                {"type": "tool_result", "tool_use_id": b.id, "content": "x = 1"} for b in calls
            ]
            messages.append({"role": "user", "content": results})
        else:
            messages.append({"role": "user", "content": "continue"})
