"""slime's `AnthropicAdapter` and `OpenAIAdapter` (`slime.agent.adapters`), on tokentrail's adapter.

Same constructor, same `.app` (an aiohttp application slime runs in a thread of its own, with
`handler_cancellation=True`), same session calls, slime `Sample`s out. Underneath is
tokentrail's `Adapter` over an SGLang engine: echoes restored, prompts spliced, every turn in
the ledger, a WARNING per finished session that lost training signal. The session calls may be
awaited from any event loop: they run on the one serving the app.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from aiohttp import web

from tokentrail.adapter import Adapter
from tokentrail.adapter.config import AdapterConfig, SessionSettings
from tokentrail.adapter.protocols.options import WireOptions
from tokentrail.core.routing import RoutingShape
from tokentrail.engines.base import GenerateRequest, Generation, SamplingParams
from tokentrail.engines.sglang import SGLangEngine
from tokentrail.errors import PolicyError, SamplingParamsError, SessionError
from tokentrail.integrations.slime import common
from tokentrail.integrations.slime.trajectory import (
    TrajectoryManager,
    slime_manager,
    slime_samples,
)
from tokentrail.kinds import History, Restore, parse_kind
from tokentrail.messages import Message, ToolSchema
from tokentrail.text.hf import HFTokenizer, as_loaded
from tokentrail.text.tokenizer import LoadedTokenizer
from tokentrail.trajectory.manager import TrajectoryManager as TrailManager
from tokentrail.trajectory.turn import TurnRecord

logger = logging.getLogger(__name__)

T = TypeVar("T")

# SGLang sampling keys slime's rollouts pass that say how to write the output, not how to
# sample it: tokentrail's engine client sets them itself (special tokens kept, stops untrimmed)
# and ends turns on the tokenizer's stop tokens.
_OUTPUT_KEYS = frozenset(
    {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stop_token_ids"}
)

# What slime parses tool calls as without a parser named: Qwen3-Coder's XML calls. The drop-in
# does so for a tokenizer of no known family (a known family's parser otherwise).
_SLIME_TOOL_FALLBACK = "qwen3_coder"

# slime's reading of the wire, where it is harmless to the samples and safe (the drop-in's
# default; docs/integrations/slime.md): the `<system-reminder>` message, tool results paired
# by position with calls that have no id, the bare role chunk of a Chat Completions stream.
SLIME_WIRE = WireOptions(system_reminder=True, results_by_position=True, bare_role_chunk=True)

DebugCallback = Callable[[str, list[Message], list[ToolSchema] | None, Message | None, Any], None]


class _RecordingManager(TrailManager):
    """tokentrail's manager, calling slime's `debug_callback` with each turn before recording
    it, as slime's adapter does; a failing callback is logged, never raised."""

    debug_callback: DebugCallback | None = None

    def record_turn(
        self,
        sid: str,
        *,
        turn: TurnRecord,
        prompt_messages: Sequence[Message],
        response_message: Message | None,
        tools: list[ToolSchema] | None = None,
        **kwargs: Any,
    ) -> int:
        callback = self.debug_callback
        if callback is not None:
            try:
                callback(sid, list(prompt_messages), tools, response_message, turn)
            except Exception:
                logger.exception("debug_callback failed (sid=%s)", sid)
        return super().record_turn(
            sid,
            turn=turn,
            prompt_messages=prompt_messages,
            response_message=response_message,
            tools=tools,
            **kwargs,
        )


class _CappedEngine:
    """The SGLang engine, with slime's rule for a session's `max_new_tokens` default: a cap a
    request's `max_tokens` may lower but not raise (tokentrail's own: a default it overrides).
    A turn goes through `common.call_sglang_generate`, looked up at every turn as slime's is, so
    what replaces it there (a test's scripted model) serves the drop-in too."""

    def __init__(self, engine: SGLangEngine, owner: common.SGLangOwner) -> None:
        self.engine = engine
        self.owner = owner
        self.name = engine.name
        self.supports_constraints = engine.supports_constraints
        self.supports_images = engine.supports_images
        self.caps: dict[str, int] = {}

    async def generate(self, req: GenerateRequest) -> Generation:
        cap = self.caps.get(req.session_id)
        if cap is not None and req.sampling.max_new_tokens > cap:
            sampling = dataclasses.replace(req.sampling, max_new_tokens=cap)
            req = dataclasses.replace(req, sampling=sampling)
        started = time.monotonic()
        prompt = [int(t) for t in req.input_ids]
        turn = await common.call_sglang_generate(
            prompt, req, {}, adapter=self.owner, session_id=req.session_id
        )
        output = [int(t) for t in turn.output_ids]
        logprobs = turn.output_log_probs
        return Generation(
            output_ids=output,
            logprobs=[0.0] * len(output)
            if logprobs is None or not len(logprobs)
            else list(logprobs),
            finish_reason=str(turn.finish_reason or "stop"),
            prompt_tokens=len(prompt),
            engine_time_s=time.monotonic() - started,
            routed_experts=turn.routed_experts,
            indexer_topk=turn.indexer_topk,
            weight_versions=tuple(turn.weight_versions),
        )

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    async def close(self) -> None:
        await self.engine.close()


def _sampling_defaults(
    params: dict[str, Any] | None, end_token_ids: frozenset[int]
) -> dict[str, Any]:
    """slime's SGLang `sampling_params` as tokentrail's; an unknown key, or stop token ids
    other than the tokenizer's end tokens, is refused here, at `open_session`, with
    `SamplingParamsError`, rather than at every turn (or silently)."""
    params = params or {}
    stops = params.get("stop_token_ids") or []
    if not set(stops) <= end_token_ids:
        raise SamplingParamsError(
            f"stop_token_ids {sorted(stops)}: a turn ends on the tokenizer's end tokens "
            f"{sorted(end_token_ids)}; other stop ids are not supported"
        )
    kept = {k: v for k, v in params.items() if k not in _OUTPUT_KEYS}
    SamplingParams(max_new_tokens=1).merged(kept)
    return kept


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class BaseAdapter:
    """The session lifecycle and app both of slime's adapters share."""

    log_prefix = "adapter"

    def __init__(
        self,
        *,
        tokenizer: LoadedTokenizer | HFTokenizer,
        sglang_url: str,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
        max_turns_per_sid: int | None = None,
        fork_threshold_tokens: int | None = None,
        debug_callback: DebugCallback | None = None,
        restore: Restore | str = Restore.ON,
        history: History | str = History.SPLICE,
        routing: RoutingShape | None = None,
        config: AdapterConfig | None = None,
        manager: TrailManager | None = None,
        system_reminder: bool = SLIME_WIRE.system_reminder,
        results_by_position: bool = SLIME_WIRE.results_by_position,
        bare_role_chunk: bool = SLIME_WIRE.bare_role_chunk,
    ) -> None:
        """slime's arguments; the rest are tokentrail's: `restore="off", history="render"`
        build prompts as slime does, `routing` (the MoE's shape) asks SGLang for every turn's
        routed experts (slime's `rollout_routed_experts`). A parser left None is the model
        family's, as `serve` picks it. The last three read the wire as slime does unless set
        False (`WireOptions`; they decide `config.wire`): a mid-list Anthropic `system`
        message as a `<system-reminder>` user message, a `tool_use` without an id answered by
        the next result naming none of its message's calls, a Chat Completions stream's first
        delta `{"role": "assistant"}`."""
        self.tokenizer = tokenizer
        self.loaded = loaded = as_loaded(tokenizer)
        self.sglang_url = sglang_url.rstrip("/")
        self.tool_parser, self.reasoning_parser = tool_parser, reasoning_parser
        self.max_turns_per_sid = max_turns_per_sid
        cfg = dataclasses.replace(
            config or AdapterConfig(),
            tool_parser=tool_parser or ("auto" if loaded.family else _SLIME_TOOL_FALLBACK),
            reasoning_parser=reasoning_parser or "auto",
            max_turns_per_session=int(max_turns_per_sid or 0),
            restore=parse_kind(Restore, restore, "restore mode"),
            history=parse_kind(History, history, "history mode"),
            routed_experts=routing is not None or (config is not None and config.routed_experts),
            wire=WireOptions(
                system_reminder=system_reminder,
                results_by_position=results_by_position,
                bare_role_chunk=bare_role_chunk,
            ),
        )
        core = manager or slime_manager(
            fork_threshold_tokens, base=_RecordingManager, routing=routing
        )
        if isinstance(core, _RecordingManager):
            core.debug_callback = debug_callback
        elif debug_callback is not None:
            raise PolicyError("debug_callback needs the adapter's own manager (manager=None)")
        self.debug_callback = debug_callback
        self.sglang = SGLangEngine(self.sglang_url, loaded)
        self.engine = _CappedEngine(self.sglang, self)
        self.adapter = Adapter(
            engine=self.engine,
            tokenizer=loaded,
            manager=core,
            config=cfg,
        )
        self.manager = TrajectoryManager(core=core)
        self.app: web.Application = self.adapter.app
        self._loop: asyncio.AbstractEventLoop | None = None
        self.app.on_startup.append(self._started)

    async def _started(self, app: web.Application) -> None:
        self._loop = asyncio.get_running_loop()

    async def _on_app_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` on the loop serving the app (the sessions' events live there)."""
        loop = self._loop
        if loop is None or loop is asyncio.get_running_loop() or not loop.is_running():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    # -- sessions ---------------------------------------------------------------------------

    def open_session(
        self,
        sid: str,
        *,
        sampling_defaults: dict[str, Any] | None = None,
        max_context_tokens: int = 0,
    ) -> None:
        """Open a session; sids are unique per agent run (a second open raises `SessionError`,
        a `ValueError` as slime's). `sampling_defaults` are slime's SGLang sampling params;
        `max_context_tokens` is the rollout's context budget."""
        defaults = _sampling_defaults(sampling_defaults, self.loaded.end_token_ids)
        self._in_app_loop(self._open, sid, defaults, int(max_context_tokens or 0))

    def _open(self, sid: str, defaults: dict[str, Any], max_context_tokens: int) -> None:
        if self.adapter.sessions.get(sid) is not None or self.adapter.manager.has_session(sid):
            raise SessionError(
                f"session_id {sid!r} already exists; sids must be unique per agent run"
            )
        self.adapter.open_session(
            sid, SessionSettings(sampling_defaults=defaults, max_context_tokens=max_context_tokens)
        )
        cap = defaults.get("max_new_tokens")
        if cap is not None:
            self.engine.caps[sid] = int(cap)

    def _in_app_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the loop serving the app, waited for (the sessions are that loop's
        to change); here when the app is not served, or from that loop itself."""
        loop = self._loop
        if loop is None or not loop.is_running() or _running_loop() is loop:
            return fn(*args)

        async def call() -> T:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout=60)

    async def shutdown_session(self, sid: str, *, wait_timeout: float = 5.0) -> None:
        """Wait up to `wait_timeout` seconds for the session's turns in flight to end."""
        await self._on_app_loop(self._idle(sid, wait_timeout))

    async def _idle(self, sid: str, wait_timeout: float) -> None:
        session = self.adapter.sessions.get(sid)
        if session is None or not session.in_flight:
            return
        try:
            await asyncio.wait_for(session.idle.wait(), wait_timeout)
        except TimeoutError:
            logger.warning(
                "[%s] sid=%s still has %d turn(s) in flight after %.1fs; finishing waits for them",
                self.log_prefix,
                sid,
                session.in_flight,
                wait_timeout,
            )

    async def finish_session(
        self,
        sid: str,
        *,
        base_sample: Any,
        reward: float = 0.0,
        extra_metadata: dict[str, Any] | None = None,
        wait_timeout: float = 5.0,
    ) -> list[Any]:
        """The session's slime `Sample`s, filled from `base_sample`, with `reward` on each and
        the trained tail decoded into `.response`; the session is consumed (a second call, or
        one for an unknown sid, returns [])."""
        await self.shutdown_session(sid, wait_timeout=wait_timeout)
        self.engine.caps.pop(sid, None)
        if self.adapter.sessions.get(sid) is None and not self.adapter.manager.has_session(sid):
            return []
        trajectory = await self._on_app_loop(
            self.adapter.finish_trajectory(sid, reward=float(reward), metadata=extra_metadata)
        )
        samples = slime_samples(trajectory, base_sample)
        for s in samples:
            n = int(s.response_length or 0)
            s.response = self.loaded.decode(s.tokens[-n:]) if n and s.tokens else ""
        return samples

    async def drop_session(self, sid: str, *, wait_timeout: float = 5.0) -> None:
        """Forget the session and its turns (after its turns in flight, up to `wait_timeout`)."""
        await self.shutdown_session(sid, wait_timeout=wait_timeout)
        self.engine.caps.pop(sid, None)
        await self._on_app_loop(self.adapter.sessions.drop_soon(sid))


class AnthropicAdapter(BaseAdapter):
    """slime's Anthropic Messages adapter (Claude Code): `POST /v1/messages`, the session id
    the API key. The app serves tokentrail's other protocols too."""

    log_prefix = "anthropic-adapter"


class OpenAIAdapter(BaseAdapter):
    """slime's OpenAI adapter (Codex): `POST /v1/chat/completions` and `POST /v1/responses`,
    the Responses API Codex speaks now, the session id the bearer token."""

    log_prefix = "openai-adapter"


__all__ = ["SLIME_WIRE", "AnthropicAdapter", "BaseAdapter", "OpenAIAdapter"]
