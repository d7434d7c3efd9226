"""The adapter's admission limits: how big, deep, long and many a request may be, how many turns
and connections run at once, and the sampling values an engine can take.

Each limit is a `tokentrail serve` flag (docs/operating/limits.md). A request past a limit that is
its own fault is a 4xx in its protocol's shape (413 for bytes, 400 for the rest); a server-wide
limit that frees up as other work finishes is a 503 with `Retry-After`. `max_tokens` above what
fits is clamped, as an engine would stop at the context length anyway.

A body is held to them once parsed (`check_shape`), its sampling once translated
(`check_sampling`), and its prompt once the turn has rendered it (`check_prompt`); the caps on
turns and engine calls at once are counted in `adapter.turn.slots`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import resource
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokentrail.engines.base import SamplingParams
from tokentrail.errors import RequestError, RequestTooLarge
from tokentrail.kinds import SettingGroup
from tokentrail.setting import MAX_SECONDS, setting

logger = logging.getLogger(__name__)

__all__ = ["Limits"]

MiB = 1024 * 1024
# Without a model config to read it from: the longest context served models commonly have.
FALLBACK_PROMPT_TOKENS = 262_144
# Keep this many descriptors for the engine client, the journal, the process itself and the
# connections the event loop accepts in one go (up to the listen backlog, 128) before the
# guard sees any of them.
_SPARE_FDS = 512
_INT64 = 2**63
LIMITS = SettingGroup.LIMITS


@dataclass
class Limits:
    """Every admission limit, with the defaults `tokentrail serve` uses. 0 turns a count off."""

    # Bytes of one request body: the Anthropic API's own limit, 32 MiB, which holds an image
    # at the default `--max-image-bytes` (20 MiB, 26.7 MiB as base64) and the rest of the
    # request with it.
    max_body_bytes: int = setting(32 * MiB, LIMITS, "one request body (413 past it)", unit="bytes")
    # Nesting of JSON values, the body itself being level 1 (a tool schema counts from there).
    max_json_depth: int = setting(64, LIMITS, "nesting of JSON values (400 past it)")
    max_messages: int = setting(10_000, LIMITS, "messages per request")
    max_tools: int = setting(1_000, LIMITS, "tools per request")
    # Bytes of all tool schemas of one request, as compact JSON.
    max_tool_schema_bytes: int = setting(
        4 * MiB, LIMITS, "all tool schemas of a request", unit="bytes"
    )
    # Prompt tokens after rendering; 0: the model config's context length, else 262144.
    max_prompt_tokens: int = setting(
        0, LIMITS, "a prompt's length; 0: the model config's context", unit="tokens"
    )
    # `max_tokens` above this (or above what fits the context) is clamped.
    max_output_tokens: int = setting(
        131_072, LIMITS, "max_tokens above this is clamped", unit="tokens"
    )
    # One request line or header line (aiohttp's own default is 8190).
    max_header_bytes: int = setting(
        16_384, LIMITS, "one request line or header line", unit="bytes", bounds=(1024, None)
    )
    # Seconds for a request's whole body to arrive once its headers have: 408 after that.
    body_timeout_s: float = setting(
        60.0, LIMITS, "time for a request body to arrive (408 after)", unit="s",
        bounds=(0, MAX_SECONDS), name="body_timeout",
    )  # fmt: skip
    # Seconds a connection may sit without a request (before the first one too), then closed.
    idle_connection_s: float = setting(
        75.0, LIMITS, "time a connection may sit without a request", unit="s",
        bounds=(0, MAX_SECONDS), name="idle_connection_timeout",
    )  # fmt: skip
    # Open connections; at the cap the longest-idle one is closed to admit a new one.
    # 0: what the process's descriptor limit leaves room for.
    max_connections: int = setting(0, LIMITS, "open connections; 0: what the fd limit allows")
    # Turns in flight at once, server-wide: 503 with Retry-After past it.
    max_concurrent_turns: int = setting(1_024, LIMITS, "turns at once (503 + Retry-After past it)")
    # Engine calls at once (the rest wait their turn); 0: no limit.
    engine_concurrency: int = setting(0, SettingGroup.ENGINE, "engine calls at once; 0: any")

    def connection_cap(self) -> int:
        if self.max_connections:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return 16_384
        return max(64, soft - _SPARE_FDS)

    # -- before translation ---------------------------------------------------------------------

    def check_shape(self, body: Mapping[str, Any], *, with_tools: bool = True) -> None:
        """Messages, tools and tool schema bytes of a parsed body, before translation (the
        tools only when `with_tools`: a caller that saw these very tools pass skips them)."""
        messages = body.get("messages")
        if isinstance(messages, list) and self.max_messages and len(messages) > self.max_messages:
            raise RequestError(
                f"too many messages: {len(messages)} > {self.max_messages} (--max-messages)"
            )
        if not with_tools:
            return
        tools = body.get("tools")
        if not isinstance(tools, list):
            return
        if self.max_tools and len(tools) > self.max_tools:
            raise RequestError(f"too many tools: {len(tools)} > {self.max_tools} (--max-tools)")
        if self.max_tool_schema_bytes:
            size = len(json.dumps(tools, separators=(",", ":"), ensure_ascii=False))
            if size > self.max_tool_schema_bytes:
                raise RequestTooLarge(
                    f"tool schemas too large: {size} bytes > {self.max_tool_schema_bytes} "
                    "(--max-tool-schema-bytes)"
                )

    # -- sampling -------------------------------------------------------------------------------

    def check_sampling(self, sampling: SamplingParams) -> None:
        """Values no engine takes are refused here, as a 400, not forwarded to become a 502."""
        _in_range("temperature", sampling.temperature, 0.0, 100.0)
        _in_range("top_p", sampling.top_p, 0.0, 1.0)
        if sampling.top_p == 0.0:
            raise RequestError("top_p must be > 0")
        if sampling.top_k != -1 and not 1 <= sampling.top_k < 2**31:
            raise RequestError(f"top_k must be -1 (off) or a positive int, got {sampling.top_k}")
        if sampling.seed is not None and not 0 <= sampling.seed < _INT64:
            raise RequestError(f"seed must be in [0, 2**63), got {sampling.seed}")
        if sampling.max_new_tokens < 1:
            raise RequestError(f"max_tokens must be >= 1, got {sampling.max_new_tokens}")
        if len(sampling.stop) > 64 or any(len(s) > 1024 for s in sampling.stop):
            raise RequestError("at most 64 stop sequences of at most 1024 characters each")

    def prompt_limit(self, context_tokens: int) -> int:
        """The most prompt tokens a request may render to."""
        return self.max_prompt_tokens or context_tokens or FALLBACK_PROMPT_TOKENS

    def check_prompt(self, prompt_tokens: int, context_tokens: int) -> None:
        limit = self.prompt_limit(context_tokens)
        if prompt_tokens > limit:
            raise RequestError(
                f"prompt is too long: {prompt_tokens} tokens > {limit} maximum "
                "(--max-prompt-tokens, default the model's context length)"
            )

    def fit_output(
        self, sampling: SamplingParams, prompt_tokens: int, context_tokens: int
    ) -> SamplingParams:
        """`sampling` with `max_new_tokens` clamped to `--max-output-tokens` and to what is
        left of the context after the prompt."""
        most = sampling.max_new_tokens
        if self.max_output_tokens:
            most = min(most, self.max_output_tokens)
        if context_tokens:
            most = min(most, max(1, context_tokens - prompt_tokens))
        if most == sampling.max_new_tokens:
            return sampling
        logger.debug("max_new_tokens %d clamped to %d", sampling.max_new_tokens, most)
        return dataclasses.replace(sampling, max_new_tokens=most)


def _in_range(name: str, value: float, low: float, high: float) -> None:
    if not math.isfinite(value) or not low <= value <= high:
        raise RequestError(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}")
