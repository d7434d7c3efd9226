"""One harness session inside a trainer's rollout worker: host the adapter, run, finish.

A `SessionHost` serves tokentrail's adapter on 127.0.0.1 in the trainer's own event loop, over
whatever `Engine` the trainer brings (its own server manager, a vLLM server, a model in
process). `SessionHost.run` opens a session, runs a `Harness` against the session's URL (the
session id is its API key), finishes the session and returns its `Trajectory`: every sample,
the ledger of every generated token, the drifts. Both trainer integrations are built on it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from aiohttp import web

from tokentrail.adapter import Adapter, start_server
from tokentrail.adapter.config import AdapterConfig, SessionSettings
from tokentrail.engines.base import Engine
from tokentrail.errors import HarnessFailed
from tokentrail.sim.harness import HarnessSim, SessionSpec
from tokentrail.text.tokenizer import LoadedTokenizer
from tokentrail.trajectory.linearize import Trajectory
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.sample import Sample

logger = logging.getLogger(__name__)


@runtime_checkable
class Harness(Protocol):
    """Anything that plays one agent session against `url`, authenticating as `session_id`.

    What it returns is handed back beside the trajectory (`SessionRun.harness_result`)."""

    async def __call__(self, url: str, session_id: str, prompt: str) -> Any: ...


@dataclass
class SimulatedHarness:
    """tokentrail's simulated coding harness (`tokentrail.sim.harness.HarnessSim`): Claude
    Code's tools over the Anthropic API by default, or `protocol="openai"` / `"responses"`;
    `spec` sets how many steps it takes and how large its context grows."""

    protocol: str = "anthropic"
    max_tokens: int = 4096
    spec: SessionSpec | None = None
    max_requests: int = 256

    async def __call__(self, url: str, session_id: str, prompt: str) -> Any:
        harness = HarnessSim(
            url,
            session_id,
            protocol=self.protocol,
            spec=self.spec,
            max_tokens=self.max_tokens,
            max_requests=self.max_requests,
        )
        return await harness.run(prompt)


@dataclass
class CommandHarness:
    """A harness CLI run as a subprocess, e.g. `["claude", "-p", "{prompt}"]`.

    `{url}`, `{session_id}` and `{prompt}` are filled in each argument and environment value.
    The child also gets the variables the harnesses read: `ANTHROPIC_BASE_URL` and
    `ANTHROPIC_AUTH_TOKEN`, `OPENAI_BASE_URL` (`{url}/v1`) and `OPENAI_API_KEY`, and
    `TOKENTRAIL_SESSION`. A non-zero exit or a run past `timeout_s` raises `HarnessFailed`."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    timeout_s: float = 1800.0

    async def __call__(self, url: str, session_id: str, prompt: str) -> Any:
        values = {"{url}": url, "{session_id}": session_id, "{prompt}": prompt}

        def fill(text: str) -> str:
            # Plain replacement, not str.format: an argument may hold other braces (JSON).
            for key, value in values.items():
                text = text.replace(key, value)
            return text

        argv = [fill(arg) for arg in self.argv]
        env = {
            **os.environ,
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_AUTH_TOKEN": session_id,
            "OPENAI_BASE_URL": f"{url}/v1",
            "OPENAI_API_KEY": session_id,
            "TOKENTRAIL_SESSION": session_id,
            **{k: fill(v) for k, v in self.env.items()},
        }
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            cwd=self.cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise HarnessFailed(f"{argv[0]} ran past {self.timeout_s:g} s") from None
        if proc.returncode != 0:
            tail = err.decode(errors="replace")[-2000:]
            raise HarnessFailed(f"{argv[0]} exited {proc.returncode}: {tail}")
        return out.decode(errors="replace")


@dataclass
class SessionRun:
    """One finished session: its id, its trajectory, and what the harness returned."""

    session_id: str
    trajectory: Trajectory
    harness_result: Any = None


class SessionHost:
    """The adapter over `engine`, served on 127.0.0.1 in the running event loop.

    async with SessionHost(engine, tokenizer) as host:
        run = await host.run(SimulatedHarness(), "Fix the bug in calc.py.")
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: LoadedTokenizer,
        *,
        config: AdapterConfig | None = None,
        manager: TrajectoryManager | None = None,
    ) -> None:
        self.adapter = Adapter(engine=engine, tokenizer=tokenizer, config=config, manager=manager)
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        if self._runner is None:
            self._runner, self.url = await start_server(self.adapter)
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
            self.adapter.offload.close()

    async def __aenter__(self) -> SessionHost:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(
        self,
        harness: Harness,
        prompt: str,
        *,
        session_id: str | None = None,
        reward: float = 0.0,
        metadata: dict[str, Any] | None = None,
        sampling_defaults: dict[str, Any] | None = None,
    ) -> SessionRun:
        """Open a session, run `harness` on `prompt` against it, finish it. A harness that
        fails drops its session (nothing half-recorded is trained) and re-raises."""
        await self.start()
        sid = session_id or f"tt-{uuid.uuid4().hex}"
        self.adapter.open_session(sid, SessionSettings(sampling_defaults=sampling_defaults or {}))
        try:
            result = await harness(self.url, sid, prompt)
        except BaseException:
            self.adapter.drop_session(sid)
            raise
        trajectory = await self.adapter.finish_trajectory(sid, reward=reward, metadata=metadata)
        return SessionRun(sid, trajectory, result)


def main_sample(trajectory: Trajectory) -> Sample:
    """The one sample a trainer that takes one sequence per rollout gets when a session has
    several (forks, sub-agents): the last chain of the main conversation (not a sub-agent's),
    the one that ends where the session ended."""
    if not trajectory.samples:
        raise HarnessFailed("the session recorded no turn: nothing to train")
    main = [s for s in trajectory.samples if not s.metadata["conversation"]["subagent"]]
    return (main or trajectory.samples)[-1]


def prompt_text(prompt: Any) -> str:
    """A trainer's prompt as the harness's task: a string as it is, a chat (a list of
    `{"role", "content"}` messages) as its last user message's text."""
    if isinstance(prompt, str):
        return prompt
    for message in reversed(list(prompt)):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        return "".join(part.get("text", "") for part in content or () if part.get("type") == "text")
    raise HarnessFailed("the prompt has no user message to hand the harness")
