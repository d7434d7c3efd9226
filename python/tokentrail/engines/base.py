"""The contract between the adapter and an inference engine: token ids in, token ids out.

An `Engine` turns a `GenerateRequest` (prompt ids, sampling, session and request ids) into a
`Generation` (sampled ids with one logprob each). `create_engine` builds one from a spec string.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from tokentrail.errors import TokentrailError

if TYPE_CHECKING:
    import aiohttp

    from tokentrail.tokenizer import LoadedTokenizer

logger = logging.getLogger(__name__)

FINISH_REASONS = ("stop", "length", "abort")

# Every request carries the session id under both names. `X-SMG-Routing-Key` is the header the
# SGLang Model Gateway (sglang-router) hashes under its `consistent_hashing` and `manual`
# policies, so every turn of a session lands on the worker that holds its prefix in KV cache;
# `X-Session-Id` is the plain name other routers and logs can key on.
ROUTING_HEADER = "X-SMG-Routing-Key"
SESSION_HEADER = "X-Session-Id"
REQUEST_ID_HEADER = "X-Request-Id"


class EngineError(Exception):
    """The engine failed a request: unreachable, non-2xx, or an answer that cannot be read.

    `status` is the engine's HTTP status when it sent one. The adapter answers the harness with
    HTTP 502 and this message.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def __str__(self) -> str:
        return self.message if self.status is None else f"{self.message} (HTTP {self.status})"


class EngineSpecError(TokentrailError):
    """An engine spec string `create_engine` does not understand."""


class SamplingParamsError(TokentrailError):
    """A sampling override names an unknown parameter or has the wrong type."""


@dataclass
class SamplingParams:
    """How to sample one turn. `top_k=-1` means no top-k; `stop` holds stop strings."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    def merged(self, overrides: Mapping[str, Any]) -> SamplingParams:
        """A copy with `overrides` applied; a `None` value leaves that parameter as it is."""
        known = {f.name for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for key, value in overrides.items():
            if key not in known:
                raise SamplingParamsError(
                    f"unknown sampling parameter {key!r}; known: {', '.join(sorted(known))}"
                )
            if value is None:
                continue
            if key == "stop":
                value = [value] if isinstance(value, str) else list(value)
                if not all(isinstance(s, str) for s in value):
                    raise SamplingParamsError("stop must be a string or a list of strings")
            elif key in ("max_new_tokens", "top_k", "seed"):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise SamplingParamsError(f"{key} must be an integer, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise SamplingParamsError(f"{key} must be a number, got {value!r}")
            else:
                value = float(value)
            changes[key] = value
        return dataclasses.replace(self, **changes)


@dataclass
class Generation:
    """One sampled turn: the output ids exactly as sampled (end-of-turn token included when the
    model emitted it) and the logprob of each under the sampling distribution."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # one of FINISH_REASONS
    prompt_tokens: int
    engine_time_s: float

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.logprobs):
            raise EngineError(
                f"engine returned {len(self.output_ids)} tokens but {len(self.logprobs)} logprobs"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise EngineError(f"unknown finish reason {self.finish_reason!r}")


def token_list(ids: Sequence[int]) -> list[int]:
    """Ids as plain ints for a JSON body, from a list or a numpy array."""
    tolist = getattr(ids, "tolist", None)
    return tolist() if tolist is not None else [int(x) for x in ids]


@dataclass
class GenerateRequest:
    """One generation call. `request_id` must be unique per call (retries included): engines
    key aborts on it, and SGLang rejects a duplicate rid."""

    # A list, or a uint32 array (spliced prompts are built as arrays); see `token_list`.
    input_ids: Sequence[int]
    sampling: SamplingParams
    session_id: str
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # The prompt messages and tools, for information; only the scripted engine reads them.
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


@runtime_checkable
class Engine(Protocol):
    """What the adapter needs from an inference engine."""

    name: str

    async def generate(self, req: GenerateRequest) -> Generation:
        """Sample one turn. Raises `EngineError`; if cancelled, the engine stops the request."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop an in-flight request, best effort; unknown ids are ignored."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


def create_engine(spec: str, tokenizer: LoadedTokenizer, *, timeout: float = 600.0) -> Engine:
    """Build an engine from `sglang://HOST:PORT`, `vllm://HOST:PORT`, `scripted`,
    `scripted:FILE` or `simulated`. The address may also be a full URL: `sglang://https://host:port`."""
    if spec == "simulated":
        from tokentrail.engines.simulated import SimulatedEngine

        return SimulatedEngine(tokenizer)
    if spec == "scripted" or spec.startswith("scripted:"):
        from tokentrail.engines.scripted import ScriptedEngine

        path = spec.removeprefix("scripted").removeprefix(":")
        if spec.startswith("scripted:") and not path:
            raise EngineSpecError("scripted:FILE needs a file name")
        return ScriptedEngine(tokenizer, path or None)
    for scheme in ("sglang", "vllm"):
        prefix = f"{scheme}://"
        if spec.startswith(prefix):
            url = _base_url(spec, spec.removeprefix(prefix))
            if scheme == "sglang":
                from tokentrail.engines.sglang import SGLangEngine

                return SGLangEngine(url, tokenizer, timeout=timeout)
            from tokentrail.engines.vllm import VLLMEngine

            return VLLMEngine(url, tokenizer, timeout=timeout)
    raise EngineSpecError(
        f"unknown engine spec {spec!r}; use sglang://HOST:PORT, vllm://HOST:PORT, "
        "scripted, scripted:FILE or simulated"
    )


def _base_url(spec: str, address: str) -> str:
    if not address.startswith(("http://", "https://")):
        address = "http://" + address
    parts = urlsplit(address.rstrip("/"))
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        parts = parts._replace(netloc="")
    if not parts.hostname or parts.path or parts.query or parts.fragment:
        raise EngineSpecError(
            f"engine spec {spec!r} needs HOST:PORT, e.g. sglang://127.0.0.1:30000"
        )
    return f"{parts.scheme}://{parts.netloc}"


# --- HTTP plumbing shared by the SGLang and vLLM clients ----------------------------------------


class HTTPEngine:
    """One `aiohttp.ClientSession` per event loop, JSON in and out, errors as `EngineError`."""

    name = "http"

    def __init__(self, base_url: str, *, timeout: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Strong references to fire-and-forget aborts, so they are not collected mid-flight.
        self._background: set[asyncio.Task[None]] = set()

    def _client(self) -> aiohttp.ClientSession:
        import aiohttp

        loop = asyncio.get_running_loop()
        # A session belongs to the loop it was made in; a new loop (each `asyncio.run`) needs
        # its own. The old one cannot be closed from here and is dropped.
        if self._session is None or self._session.closed or self._loop is not loop:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
            self._loop = loop
        return self._session

    def _headers(self, req: GenerateRequest) -> dict[str, str]:
        return {
            ROUTING_HEADER: req.session_id,
            SESSION_HEADER: req.session_id,
            REQUEST_ID_HEADER: req.request_id,
        }

    async def _request_json(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        import aiohttp

        url = self.base_url + path
        kwargs: dict[str, Any] = {"headers": dict(headers or {})}
        if body is not None:
            kwargs["json"] = body
        if timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout)
        try:
            async with self._client().request(method, url, **kwargs) as resp:
                raw = await resp.read()
                status = resp.status
        except TimeoutError:
            raise EngineError(
                f"{self.name} did not answer {path} within {timeout or self.timeout:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise EngineError(f"cannot reach {self.name} at {url}: {exc}") from None
        if not 200 <= status < 300:
            raise EngineError(f"{self.name}: {error_message(raw)}", status)
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EngineError(f"{self.name} answered {path} with invalid JSON", status) from None

    async def _abort_in_background(self, coro: Any) -> None:
        """Run an abort to completion even if the caller is cancelled again meanwhile."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            pass  # the abort goes on in the background; the caller re-raises its own cancel

    async def close(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._session is not None and not self._session.closed:
            if self._loop is asyncio.get_running_loop():
                await self._session.close()
        self._session = None


def error_message(raw: bytes) -> str:
    """The message in an engine's error body: `{"error": {"message"}}` (SGLang, vLLM),
    `{"message"}` (older vLLM), `{"detail"}` (FastAPI), else the text itself."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text[:1000] or "empty error response"
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str) and err:
            return err
        for key in ("message", "detail"):
            if obj.get(key):
                value = obj[key]
                return value if isinstance(value, str) else json.dumps(value)
    return text[:1000]
