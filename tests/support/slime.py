"""What slime's own agent tests stand on, rebuilt for tokentrail's slime integration.

A real Hugging Face tokenizer (`transformers.PreTrainedTokenizerFast` over the builtin Qwen3
vocabulary's tokenizer.json, with the Qwen3 chat template), as slime's `load_tokenizer` hands
one to the adapter; scripted replies for the stand-in SGLang server (`fake_engines.FakeSGLang`)
written as Qwen3 writes them; slime's `run_app_in_thread` (the adapter app on a daemon thread of
its own, `handler_cancellation=True`); and a slime-style `generate()`: open a session, let an
agent run against the adapter, finish the session into samples (an ABORTED sample when empty).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tokentrail.engines.scripted import blocks_to_message, scripted_logprob
from tokentrail.integrations.slime import BaseAdapter, sample_class
from tokentrail.text.families import family
from tokentrail.text.tokenizer import LoadedTokenizer

IM_END = "<|im_end|>"


@functools.cache
def hf_tokenizer(loaded: LoadedTokenizer) -> Any:
    """A `transformers` fast tokenizer of `loaded`'s vocabulary and chat template (one per
    `loaded`, shared by the test modules: wrapping it loads the vocabulary into the core)."""
    import transformers

    assert loaded.path is not None
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(loaded.path),
        eos_token=loaded.eos_token,
        pad_token=loaded.pad_token,
        name_or_path="Qwen3-hf",
    )
    hf.chat_template = loaded.chat_template
    return hf


class ScriptedReplies:
    """A `FakeSGLang` reply function: the next scripted reply per call, written as Qwen3 writes
    it (Hermes tool calls, `<think>` reasoning), encoded with the Hugging Face tokenizer and
    closed with `<|im_end|>`; logprobs fixed by (token, position). Past the script: "Done."."""

    def __init__(self, hf: Any, replies: Sequence[Sequence[dict[str, Any]] | str]) -> None:
        self.hf = hf
        self.family = family("qwen3")
        self.replies = list(replies)
        self.prompts: list[list[int]] = []
        self.outputs: list[list[int]] = []

    def text(self, i: int) -> str:
        reply = self.replies[i] if i < len(self.replies) else "Done."
        if isinstance(reply, str):
            return reply
        return self.family.format_output(blocks_to_message(reply))

    def __call__(self, input_ids: list[int]) -> tuple[list[int], list[float], str]:
        text = self.text(len(self.prompts))
        self.prompts.append(list(input_ids))
        ids = [
            *self.hf.encode(text, add_special_tokens=False),
            self.hf.convert_tokens_to_ids(IM_END),
        ]
        self.outputs.append(ids)
        return ids, [scripted_logprob(t, i) for i, t in enumerate(ids)], "stop"


class ByPrompt(ScriptedReplies):
    """Replies chosen by the prompt: reply N answers a prompt holding N assistant turns of the
    main conversation (the one that starts with `marker`); any other prompt (a harness's side
    request) gets "OK."."""

    def __init__(self, hf: Any, replies: Sequence[Sequence[dict[str, Any]] | str], marker: str):
        super().__init__(hf, replies)
        self.marker = marker

    def __call__(self, input_ids: list[int]) -> tuple[list[int], list[float], str]:
        prompt = self.hf.decode(input_ids)
        if self.marker not in prompt:
            text = "OK."
        else:
            text = self.text(prompt.count("<|im_start|>assistant") - 1)
        self.prompts.append(list(input_ids))
        ids = [
            *self.hf.encode(text, add_special_tokens=False),
            self.hf.convert_tokens_to_ids(IM_END),
        ]
        self.outputs.append(ids)
        return ids, [scripted_logprob(t, i) for i, t in enumerate(ids)], "stop"


@dataclass
class AppHandle:
    """slime's `aiohttp_threaded.AppHandle`: where the app listens and how to stop it."""

    port: int
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop
    runner: web.AppRunner

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def run_app_in_thread(app: web.Application, host: str = "127.0.0.1") -> AppHandle:
    """Serve `app` on a daemon thread with its own event loop, as slime's `run_app_in_thread`
    does in `generate.py` (`handler_cancellation=True`); return once it listens."""
    started = threading.Event()
    box: dict[str, Any] = {}
    loop = asyncio.new_event_loop()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, host, 0)
            loop.run_until_complete(site.start())
            box["runner"], box["port"] = runner, runner.addresses[0][1]
        except BaseException as exc:
            box["error"] = exc
            raise
        finally:
            started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="slime-adapter", daemon=True)
    thread.start()
    assert started.wait(30)
    if "error" in box:
        raise box["error"]
    return AppHandle(box["port"], thread, loop, box["runner"])


Agent = Callable[[str, str], Awaitable[int]]


async def generate(
    adapter: BaseAdapter,
    adapter_url: str,
    base_sample: Any,
    sampling_params: dict[str, Any],
    agent: Agent,
    *,
    reward: float = 1.0,
) -> list[Any]:
    """slime's `examples/coding_agent_rl/generate.py` flow without the sandbox and grader: open
    the session, run the agent (`agent(adapter_url, session_id)`, its exit code), finish the
    session into samples with the agent's exit code in their metadata, or return one ABORTED
    sample when the agent left nothing to train on."""
    session_id = base_sample.session_id = (
        f"{base_sample.metadata['instance_id']}-{base_sample.index}"
    )
    adapter.open_session(session_id, sampling_defaults=sampling_params, max_context_tokens=0)
    try:
        exit_code = await agent(adapter_url, session_id)
        samples = await adapter.finish_session(
            session_id,
            base_sample=base_sample,
            reward=reward,
            extra_metadata={
                "grading_solved": reward == 1.0,
                "instance_id": base_sample.metadata["instance_id"],
            },
        )
    except BaseException:
        await adapter.drop_session(session_id)
        raise
    if not samples:
        base_sample.status = sample_class().Status.ABORTED
        base_sample.metadata = {**base_sample.metadata, "abort_reason": "adapter_session_empty"}
        base_sample.reward = 0.0
        return [base_sample]
    for s in samples:
        s.metadata = {**s.metadata, "agent_exit_code": exit_code}
    return samples
