"""Small aiohttp servers that speak SGLang's and vLLM's wire formats, for engine-client tests.

`async with FakeSGLang(reply) as srv:` serves on a free 127.0.0.1 port at `srv.url`, records each
request (path, JSON body, headers), and can be switched to `fail` (HTTP 500) or `hang` mode.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web

# input_ids -> (output_ids, logprobs, finish reason "stop" | "length")
ReplyFn = Callable[[list[int]], tuple[list[int], list[float], str]]

IM_END = 151645
HANG_LIMIT_S = 30.0


def echo_reply(input_ids: list[int]) -> tuple[list[int], list[float], str]:
    """The last three prompt ids, then `<|im_end|>`, each with logprob -0.5 * (i + 1)."""
    ids = [*input_ids[-3:], IM_END]
    return ids, [-0.5 * (i + 1) for i in range(len(ids))], "stop"


@dataclass
class Recorded:
    path: str
    body: Any
    headers: dict[str, str]


@dataclass
class _FakeServer:
    reply: ReplyFn = echo_reply
    # "ok", "fail" (HTTP 500 with the engine's error body) or "hang" (no answer until cancelled,
    # aborted, or HANG_LIMIT_S).
    mode: str = "ok"
    fail_message: str = "CUDA out of memory (fake)"
    fail_status: int = 500
    # False: answer more tokens than `max_new_tokens`, as a faulty engine might.
    truncate: bool = True
    requests: list[Recorded] = field(default_factory=list)
    # Request ids whose handler was cancelled because the client closed the connection.
    disconnected: list[str] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.add_routes(self.routes())
        # Handler cancellation stands in for the real engines' disconnect handling (vLLM's
        # `with_cancellation`): a client that goes away cancels the handler.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _record(self, request: web.Request) -> Any:
        body = await request.json() if request.can_read_body else None
        self.requests.append(Recorded(request.path, body, dict(request.headers)))
        return body

    def bodies(self, path: str) -> list[Any]:
        return [r.body for r in self.requests if r.path == path]

    def _truncate(
        self, body_ids: list[int], limit: int | None
    ) -> tuple[list[int], list[float], str]:
        ids, logprobs, finish = self.reply(body_ids)
        if self.truncate and limit is not None and len(ids) > limit:
            ids, logprobs, finish = ids[:limit], logprobs[:limit], "length"
        return ids, logprobs, finish


@dataclass
class FakeSGLang(_FakeServer):
    """POST /generate, POST /abort_request, GET /health, as `sglang.launch_server` answers."""

    aborted: list[str] = field(default_factory=list)
    _abort_events: dict[str, asyncio.Event] = field(default_factory=dict)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/generate", self._generate),
            web.post("/abort_request", self._abort),
            web.get("/health", self._health),
        ]

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _abort(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        rid = body.get("rid", "")
        self.aborted.append(rid)
        if rid in self._abort_events:
            self._abort_events[rid].set()
        return web.Response(status=200)

    async def _generate(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        rid = body.get("rid") or uuid.uuid4().hex
        if self.mode == "fail":
            # http_server._create_error_response's shape.
            return web.json_response(
                {"error": {"message": self.fail_message}}, status=self.fail_status
            )
        input_ids = body["input_ids"]
        if self.mode == "hang":
            event = self._abort_events.setdefault(rid, asyncio.Event())
            try:
                await asyncio.wait_for(event.wait(), HANG_LIMIT_S)
            except asyncio.CancelledError:
                self.disconnected.append(rid)
                raise
            except TimeoutError:
                pass
            meta = self._meta(rid, input_ids, [], [], {"type": "abort", "message": "Abort"})
            return web.json_response({"text": "", "output_ids": [], "meta_info": meta})
        limit = body.get("sampling_params", {}).get("max_new_tokens")
        ids, logprobs, finish = self._truncate(input_ids, limit)
        reason: dict[str, Any] = (
            {"type": "stop", "matched": ids[-1]}
            if finish == "stop"
            else {"type": "length", "length": len(ids)}
        )
        meta = self._meta(rid, input_ids, ids, logprobs, reason)
        return web.json_response({"text": "", "output_ids": ids, "meta_info": meta})

    def _meta(
        self,
        rid: str,
        input_ids: list[int],
        ids: list[int],
        logprobs: list[float],
        reason: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            "id": rid,
            "finish_reason": reason,
            "prompt_tokens": len(input_ids),
            "weight_version": "default",
            "input_token_logprobs": [],
            # return_text_in_logprobs is off, so the text slot is null.
            "output_token_logprobs": [[lp, t, None] for t, lp in zip(ids, logprobs, strict=True)],
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "e2e_latency": 0.001,
        }


@dataclass
class FakeVLLM(_FakeServer):
    """POST /v1/completions and GET /v1/models, as `vllm serve` answers."""

    model: str = "Qwen/Qwen3-8B"

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/completions", self._completions),
            web.get("/v1/models", self._models),
        ]

    async def _models(self, request: web.Request) -> web.Response:
        await self._record(request)
        card = {
            "id": self.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": 40960,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def _completions(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        rid = request.headers.get("X-Request-Id", uuid.uuid4().hex)
        if self.mode == "fail":
            # vLLM's ErrorResponse (current shape).
            error = {
                "message": self.fail_message,
                "type": "InternalServerError",
                "param": None,
                "code": self.fail_status,
            }
            return web.json_response({"error": error}, status=self.fail_status)
        if self.mode == "hang":
            try:
                await asyncio.sleep(HANG_LIMIT_S)
            except asyncio.CancelledError:
                self.disconnected.append(rid)
                raise
        prompt = body["prompt"]
        ids, logprobs, finish = self._truncate(prompt, body.get("max_tokens"))
        choice = {
            "index": 0,
            "text": "",
            "logprobs": {
                "text_offset": [0] * len(ids),
                "token_logprobs": logprobs,
                "tokens": [f"token_id:{t}" for t in ids],
                "top_logprobs": [
                    {f"token_id:{t}": lp} for t, lp in zip(ids, logprobs, strict=True)
                ],
            },
            "finish_reason": finish,
            "stop_reason": None,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt,
            "token_ids": ids,
        }
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt) + len(ids),
        }
        return web.json_response(
            {
                "id": f"cmpl-{rid}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": [choice],
                "usage": usage,
            }
        )
