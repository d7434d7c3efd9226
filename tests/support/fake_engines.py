"""Small aiohttp servers that speak SGLang's and vLLM's wire formats, for engine-client tests.

`async with FakeSGLang(reply) as srv:` serves on a free 127.0.0.1 port at `srv.url`, records each
request (path, JSON body, headers), and can be switched to `fail` (HTTP 500) or `hang` mode.
Given a `KVRouting`, a server answers for routed experts as one launched with
`--enable-return-routed-experts` does: rows of every position it fed forward, a cached prefix's
rows as stored when first computed.

An answer goes out as `delivery` says: `whole` (one write with `Content-Length`), `pieces`
(`Content-Length`, then `piece_bytes` at a time) or `chunked` (chunked transfer encoding, no
length), each piece `trickle_s` after the last; `pad_to` pads it with JSON whitespace to exactly
that many bytes (an answer at a bound, or one byte over it).

A request with `stream: true` is answered as the real engine streams (server-sent events
`data: {json}`, then `data: [DONE]`), `tokens_per_event` tokens an event (SGLang's
`--stream-interval`), `token_delay_s` between events, `first_token_s` before the first one
(queueing and prefill), with `stall_at=k` a stall after k tokens until the request is
aborted (or the client goes), as a loaded engine stalls, and with `hold_at=k` a pause after k
tokens until the test sets `release` (what the client saw by then went out mid-turn). SGLang's
events are cumulative by default and deltas with `incremental`
(`--incremental-streaming-output`); vLLM's are deltas.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from aiohttp import web

from tokentrail.core.routing import IndexerShape
from tokentrail.sim.moe import KVRouting

# input_ids -> (output_ids, logprobs, finish reason "stop" | "length")
ReplyFn = Callable[[list[int]], tuple[list[int], list[float], str]]

IM_START, IM_END = 151644, 151645
# Qwen3's `<|vision_start|>`, `<|vision_end|>` and `<|image_pad|>` (Qwen2.5-VL and Qwen3-VL
# share the vocabulary).
VISION_START, VISION_END, IMAGE_PAD = 151652, 151653, 151655
HANG_LIMIT_S = 30.0
# SGLang `sampling_params` constraint keys: strings, at most one (sampling_params.py).
SGLANG_CONSTRAINTS = ("json_schema", "regex", "ebnf", "structural_tag")
# vLLM >= 0.12 `structured_outputs` keys: exactly one per request.
VLLM_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
# The weight push's POST routes of a `VLLM_SERVER_DEV_MODE=1` server.
DEV_POSTS = (
    "/pause",
    "/resume",
    "/collective_rpc",
    "/reset_prefix_cache",
    "/update_weight_version",
)
# The fields of vLLM's `SamplingParams` (vllm/sampling_params.py) a JSON body may set.
VLLM_SAMPLING_PARAMS = frozenset(
    "n presence_penalty frequency_penalty repetition_penalty temperature top_p top_k min_p "
    "seed stop stop_token_ids ignore_eos max_tokens min_tokens logprobs prompt_logprobs "
    "detokenize skip_special_tokens spaces_between_special_tokens include_stop_str_in_output "
    "structured_outputs logit_bias allowed_token_ids extra_args bad_words "
    "routed_experts_prompt_start".split()
)


def echo_reply(input_ids: list[int]) -> tuple[list[int], list[float], str]:
    """The last three prompt ids, then `<|im_end|>`, each with logprob -0.5 * (i + 1)."""
    ids = [*input_ids[-3:], IM_END]
    return ids, [-0.5 * (i + 1) for i in range(len(ids))], "stop"


@dataclass
class Recorded:
    path: str
    body: Any
    headers: dict[str, str]


_Server = TypeVar("_Server", bound="_FakeServer")


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
    # How an answer is sent (see the module docstring).
    delivery: str = "whole"
    piece_bytes: int = 1024
    trickle_s: float = 0.0
    pad_to: int | None = None
    # The size in bytes of every 2xx answer sent, in order.
    sent_bytes: list[int] = field(default_factory=list)
    # How a streamed answer goes out (see the module docstring).
    tokens_per_event: int = 1
    token_delay_s: float = 0.0
    first_token_s: float = 0.0
    stall_at: int | None = None
    # With `hold_at=k`, the first streamed answer waits after k tokens until `release` is set
    # (a test's client sets it once it has seen what it waits for); `holding` meanwhile.
    hold_at: int | None = None
    release: asyncio.Event = field(default_factory=asyncio.Event)
    holding: bool = False
    # Every streamed answer's events, as sent (the JSON objects), and when each was written
    # (`time.perf_counter`), by request id.
    streamed: dict[str, list[Any]] = field(default_factory=dict)
    streamed_at: dict[str, list[float]] = field(default_factory=dict)
    _runner: web.AppRunner | None = None

    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    async def __aenter__(self: _Server) -> _Server:
        # The real engines take prompts of any length (FastAPI reads the whole body).
        app = web.Application(client_max_size=1 << 30)
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

    async def _answer(self, request: web.Request, obj: Any, rid: str) -> web.StreamResponse:
        """`obj` as JSON, sent the way `delivery`, `piece_bytes`, `trickle_s` and `pad_to` say."""
        data = json.dumps(obj, separators=(",", ":")).encode()
        if self.pad_to is not None:
            data += b" " * max(0, self.pad_to - len(data))
        self.sent_bytes.append(len(data))
        if self.delivery == "whole":
            return web.Response(body=data, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if self.delivery == "pieces":
            response.content_length = len(data)
        elif self.delivery == "chunked":
            response.enable_chunked_encoding()
        else:
            raise ValueError(f"unknown delivery {self.delivery!r}")
        await response.prepare(request)
        view = memoryview(data)
        try:
            for at in range(0, len(data), self.piece_bytes):
                if self.trickle_s:
                    await asyncio.sleep(self.trickle_s)
                await response.write(view[at : at + self.piece_bytes])
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            self.disconnected.append(rid)
            raise
        return response

    async def _stream(
        self,
        request: web.Request,
        rid: str,
        n_tokens: int,
        event: Callable[[int, int, bool], Any],
        stalled: Callable[[], Any],
        after: list[Any] | None = None,
    ) -> web.StreamResponse:
        """Server-sent events: `event(start, end, last)` for each run of tokens; at `stall_at`
        tokens, `stalled()` (awaited: the abort-final event, or None) instead of the rest."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        sent: list[Any] = []
        self.streamed[rid] = sent
        times = self.streamed_at[rid] = []

        async def send(obj: Any) -> None:
            sent.append(obj)
            times.append(time.perf_counter())
            await response.write(
                b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
            )

        try:
            if self.first_token_s:
                await asyncio.sleep(self.first_token_s)
            at = 0
            step = max(1, self.tokens_per_event)
            while True:
                if self.hold_at is not None and at >= self.hold_at:
                    self.hold_at, self.holding = None, True
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.release.wait(), HANG_LIMIT_S)
                    self.holding = False
                if self.stall_at is not None and at >= self.stall_at:
                    final = await stalled()
                    if final is not None:
                        await send(final)
                    break
                end = min(n_tokens, at + step)
                await send(event(at, end, end >= n_tokens))
                at = end
                if at >= n_tokens:
                    break
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
            for obj in after or ():
                await send(obj)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            self.disconnected.append(rid)
            raise
        return response

    def bodies(self, path: str) -> list[Any]:
        return [r.body for r in self.requests if r.path == path]

    def _truncate(
        self, body_ids: list[int], limit: int | None
    ) -> tuple[list[int], list[float], str]:
        ids, logprobs, finish = self.reply(body_ids)
        if self.truncate and limit is not None and len(ids) > limit:
            ids, logprobs, finish = ids[:limit], logprobs[:limit], "length"
        return ids, logprobs, finish


def indexer_rows(fed: int, shape: IndexerShape) -> np.ndarray:
    """A DSA indexer's top-k for `fed` positions: earlier positions, -1 where there are none."""
    positions = np.arange(fed)[:, None, None]
    picks = positions - np.arange(shape.layers)[None, :, None] - np.arange(shape.top_k)
    return np.where(picks >= 0, picks, -1).astype(np.int32)


def b64_int32(rows: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(rows, dtype="<i4").tobytes()).decode("ascii")


def _vllm_error(message: str, status: int, kind: str = "BadRequestError") -> web.Response:
    """vLLM's `ErrorResponse` (current shape)."""
    error = {"message": message, "type": kind, "param": None, "code": status}
    return web.json_response({"error": error}, status=status)


def _image_data_refusal(image_data: Any, input_ids: list[int]) -> str | None:
    """Why SGLang would refuse `image_data` beside `input_ids`, or None: each entry a URL,
    path or base64 string (here only data URLs and base64, which need no fetch) that loads as
    an image, one per `<|vision_start|><|image_pad|>...` run of the prompt."""
    if image_data is None:
        runs = _image_runs(input_ids)
        return None if runs == 0 else f"the prompt has {runs} image runs but no image_data"
    items = [image_data] if isinstance(image_data, str) else image_data
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        return "image_data must be a string or a list of strings"
    from PIL import Image

    for x in items:
        payload = x.split(",", 1)[1] if x.startswith("data:") else x
        try:
            with Image.open(io.BytesIO(base64.b64decode(payload, validate=True))) as img:
                img.load()
        except Exception as exc:  # SGLang's load_image raises whatever PIL raises.
            return f"Failed to load image: {exc}"
    runs = _image_runs(input_ids)
    if runs != len(items):
        return f"{len(items)} images in image_data for {runs} image token runs in input_ids"
    return None


def version_spans(versions: list[str]) -> list[dict[str, Any]]:
    """vLLM's `weight_versions` of an output whose tokens were sampled by `versions`: a span
    per run of one version (none for no tokens)."""
    spans: list[dict[str, Any]] = []
    for i, version in enumerate(versions):
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": version, "start": i, "end": i + 1})
    return spans


def _image_runs(input_ids: list[int]) -> int:
    return sum(
        1
        for a, b in zip(input_ids, input_ids[1:], strict=False)
        if a == VISION_START and b == IMAGE_PAD
    )


@dataclass
class FakeSGLang(_FakeServer):
    """POST /generate, POST /abort_request, GET /health, as `sglang.launch_server` answers."""

    aborted: list[str] = field(default_factory=list)
    _abort_events: dict[str, asyncio.Event] = field(default_factory=dict)
    # `--enable-return-routed-experts`: what the server holds per position it fed forward.
    routing: KVRouting | None = None
    # SGLang 0.5.9 to 0.5.11 accept `routed_experts_start_len` and return every position.
    ignores_routing_start: bool = False
    # `--enable-return-indexer-topk` for a model of this indexer shape.
    indexer: IndexerShape | None = None
    weight_version: str = "default"
    # 0.5.20+ also sends spans `[(version, start, end)]` over the output.
    weight_spans: list[tuple[str, int, int]] | None = None
    # `--incremental-streaming-output`: stream events hold only the new tokens.
    incremental: bool = False
    # Every `meta_info` answered, in order, and the routed experts rows sent in each.
    answers: list[dict[str, Any]] = field(default_factory=list)
    routed_rows: list[np.ndarray] = field(default_factory=list)

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
        params = body.get("sampling_params", {})
        set_constraints = [k for k in SGLANG_CONSTRAINTS if params.get(k) is not None]
        if len(set_constraints) > 1:
            message = "Only one of json_schema, regex, ebnf, or structural_tag can be set."
            return web.json_response({"error": {"message": message}}, status=400)
        if set_constraints and not isinstance(params[set_constraints[0]], str):
            message = f"unknown variant: {set_constraints[0]} must be a string"
            return web.json_response({"error": {"message": message}}, status=400)
        refused = _image_data_refusal(body.get("image_data"), input_ids)
        if refused is not None:
            return web.json_response({"error": {"message": refused}}, status=400)
        if self.mode == "hang":
            event = self._abort_events.setdefault(rid, asyncio.Event())
            try:
                await asyncio.wait_for(event.wait(), HANG_LIMIT_S)
            except asyncio.CancelledError:
                self.disconnected.append(rid)
                raise
            except asyncio.TimeoutError:
                pass
            meta = self._meta(rid, input_ids, [], [], {"type": "abort", "message": "Abort"})
            return web.json_response({"text": "", "output_ids": [], "meta_info": meta})
        start = body.get("routed_experts_start_len", 0)
        if body.get("return_routed_experts") and not 0 <= start <= len(input_ids):
            # scheduler.py aborts it before it runs, with status 400.
            message = (
                f"routed_experts_start_len={start} is higher than the number of input tokens "
                f"{len(input_ids)}"
            )
            return web.json_response({"error": {"message": message}}, status=400)
        limit = body.get("sampling_params", {}).get("max_new_tokens")
        ids, logprobs, finish = self._truncate(input_ids, limit)
        reason: dict[str, Any] = (
            {"type": "stop", "matched": ids[-1]}
            if finish == "stop"
            else {"type": "length", "length": len(ids)}
        )
        meta = self._meta(rid, input_ids, ids, logprobs, reason)
        if body.get("return_routed_experts") and self.routing is not None:
            start = 0 if self.ignores_routing_start else start
            rows, cached = self.routing.serve(input_ids, ids, start, len(self.requests))
            self.routed_rows.append(rows)
            meta["routed_experts"] = b64_int32(rows)
            meta["cached_tokens"] = cached
            meta["cached_tokens_details"] = {"device": cached, "host": 0}
        if body.get("return_indexer_topk") and self.indexer is not None:
            fed = max(0, len(input_ids) + len(ids) - 1)
            meta["indexer_topk"] = b64_int32(indexer_rows(fed, self.indexer))
        if self.weight_spans is not None:
            meta["weight_versions"] = [
                {"version": v, "start": a, "end": b} for v, a, b in self.weight_spans
            ]
            meta["weight_version"] = self.weight_spans[-1][0]
        self.answers.append(meta)
        if body.get("stream"):
            return await self._stream_generate(request, rid, input_ids, ids, logprobs, meta)
        return await self._answer(request, {"text": "", "output_ids": ids, "meta_info": meta}, rid)

    async def _stream_generate(
        self,
        request: web.Request,
        rid: str,
        input_ids: list[int],
        ids: list[int],
        logprobs: list[float],
        final: dict[str, Any],
    ) -> web.StreamResponse:
        """SGLang's stream (tokenizer_manager `_handle_batch_output`): every event's
        `meta_info` counts all `completion_tokens` so far; by default `output_ids` and
        `output_token_logprobs` hold every token so far (`text` null until the last event),
        with `incremental` only the new ones. Replay rows and `e2e_latency` come with the
        last event alone."""
        replay_keys = ("routed_experts", "indexer_topk", "cached_tokens_details", "e2e_latency")

        def meta_for(start: int, end: int, reason: Any) -> dict[str, Any]:
            meta = self._meta(rid, input_ids, ids[:end], logprobs[:end], reason)
            for key in replay_keys:
                meta.pop(key, None)
            if self.incremental:
                meta["output_token_logprobs"] = meta["output_token_logprobs"][start:]
            return meta

        def event(start: int, end: int, last: bool) -> Any:
            if last:
                meta = dict(final)
                if self.incremental:
                    meta["output_token_logprobs"] = meta["output_token_logprobs"][start:]
            else:
                meta = meta_for(start, end, None)
            out_ids = ids[start:end] if self.incremental else ids[:end]
            text = "" if self.incremental or last else None
            return {"text": text, "output_ids": out_ids, "meta_info": meta}

        async def stalled() -> Any:
            at = self.stall_at or 0
            abort = self._abort_events.setdefault(rid, asyncio.Event())
            try:
                await asyncio.wait_for(abort.wait(), HANG_LIMIT_S)
            except TimeoutError:
                pass
            meta = meta_for(at, at, {"type": "abort", "message": "Abort in waiting queue"})
            meta["output_token_logprobs"] = (
                [] if self.incremental else meta["output_token_logprobs"]
            )
            return {
                "text": "",
                "output_ids": [] if self.incremental else ids[:at],
                "meta_info": meta,
            }

        return await self._stream(request, rid, len(ids), event, stalled)

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
            "weight_version": self.weight_version,
            "input_token_logprobs": [],
            # return_text_in_logprobs is off, so the text slot is null.
            "output_token_logprobs": [[lp, t, None] for t, lp in zip(ids, logprobs, strict=True)],
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "e2e_latency": 0.001,
        }


@dataclass
class FakeVLLM(_FakeServer):
    """POST /v1/completions and GET /v1/models, as `vllm serve` answers; for a model that takes
    images, POST /v1/chat/completions/render and POST /inference/v1/generate (tokens in, tokens
    out, with the rendered images' features) as vLLM 0.21 and later answer them."""

    model: str = "Qwen/Qwen3-8B"
    # `--enable-return-routed-experts`: every non-stream choice carries them, as a .npy.
    routing: KVRouting | None = None
    weight_version: str = "default"
    # `VLLM_SERVER_DEV_MODE=1`: the RL routes are served: `GET /weight_info`, and a weight
    # push's `/pause?mode=`, `/collective_rpc`, `/reset_prefix_cache`,
    # `/update_weight_version`, `/resume`, `GET /is_paused`.
    dev_mode: bool = False
    # Seconds between the sampled tokens of an answer (0: all at once): how long a turn is in
    # flight for a `/pause` to find it. Paused, a new request waits for `/resume` (vLLM queues
    # it); `abort` answers the ones in flight with the tokens sampled so far, finish `abort`;
    # `keep` freezes them until `/resume`; `wait` lets them finish. A streamed answer goes out
    # once its tokens are sampled (vLLM streams them as they come, then a last chunk that says
    # `abort` with no tokens: the client reads the same tokens either way).
    token_s: float = 0.0
    paused: str | None = None
    # How long `/collective_rpc` (a weight reload) takes.
    reload_s: float = 0.0
    # The dev routes called, in order: (path with query, JSON body).
    dev_calls: list[tuple[str, Any]] = field(default_factory=list)
    _resumed: asyncio.Event = field(default_factory=asyncio.Event)
    _aborts: int = 0
    # `--max-model-len`: in `GET /v1/models`, and a longer prompt is refused (400). By
    # default a 256K context, which the 128K-token prompt tests fit.
    max_model_len: int = 262144
    # `--enable-scale-out`: without it vLLM 0.32 answers its render and tokens routes 403.
    scale_out: bool = True
    # Every completion answered, in order.
    answered: list[dict[str, Any]] = field(default_factory=list)
    # The served model's image processor (Qwen3-VL's `preprocessor_config.json`;
    # `--mm-processor-kwargs` changes it): how a render sizes an image.
    patch_size: int = 16
    merge_size: int = 2
    min_pixels: int = 65536
    max_pixels: int = 16777216
    # `--mm-processor-cache-gb` above 0 (vLLM's default): a render of an image already sent
    # answers None for its tensors, and the engine takes them from its own cache by hash.
    processor_cache: bool = True
    # Hashes a render sent tensors for; the tensors the engine holds, by hash.
    rendered: set[str] = field(default_factory=set)
    held: dict[str, dict[str, Any]] = field(default_factory=dict)

    def routes(self) -> list[web.RouteDef]:
        dev = (
            [
                web.get("/weight_info", self._weight_info),
                web.get("/is_paused", self._is_paused),
                *(web.post(path, self._dev) for path in DEV_POSTS),
            ]
            if self.dev_mode
            else []
        )
        render, tokens = self._render, self._generate_tokens
        if not self.scale_out:
            render = tokens = self._scale_out_disabled
        return [
            *dev,
            web.post("/v1/completions", self._completions),
            web.get("/v1/models", self._models),
            web.post("/v1/chat/completions/render", render),
            web.post("/inference/v1/generate", tokens),
        ]

    async def _scale_out_disabled(self, request: web.Request) -> web.Response:
        """vllm 0.32 `scale_out/factories.py`: the routes are there, and refuse."""
        await self._record(request)
        message = (
            "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to "
            "enable them."
        )
        return _vllm_error(message, 403, "PermissionDeniedError")

    async def _render(self, request: web.Request) -> web.Response:
        """`ServingRender`: the chat's token ids as the template and processor expand them,
        and `features` with one item per image: its hash, its pad run in those ids and its
        processed tensors (here a JSON stand-in for vLLM's msgpack of `pixel_values` and
        `image_grid_thw`, opaque to the client as the real one is)."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        body = await self._record(request)
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list):
            return _vllm_error("messages: Field required", 400)
        ids = [IM_START, 872, 198]
        hashes: list[str] = []
        places: list[dict[str, int]] = []
        items: list[str | None] = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            for part in content if isinstance(content, list) else []:
                if not isinstance(part, dict) or part.get("type") != "image_url":
                    continue
                url = (part.get("image_url") or {}).get("url", "")
                if not url.startswith("data:"):
                    return _vllm_error("the stand-in fetches no image URLs", 400)
                from PIL import Image

                try:
                    data = base64.b64decode(url.split(",", 1)[1], validate=True)
                    with Image.open(io.BytesIO(data)) as img:
                        img.load()
                        width, height = img.size
                except Exception as exc:  # vLLM's MediaConnector raises what PIL raises
                    return _vllm_error(f"Failed to load image: {exc}", 400)
                h, w = smart_resize(
                    height,
                    width,
                    factor=self.patch_size * self.merge_size,
                    min_pixels=self.min_pixels,
                    max_pixels=self.max_pixels,
                )
                grid = [1, h // self.patch_size, w // self.patch_size]
                tokens = grid[0] * grid[1] * grid[2] // self.merge_size**2
                digest = hashlib.sha256(data).hexdigest()
                ids.append(VISION_START)
                places.append({"offset": len(ids), "length": tokens})
                ids += [IMAGE_PAD] * tokens + [VISION_END]
                hashes.append(digest)
                if self.processor_cache and digest in self.rendered:
                    items.append(None)
                else:
                    item = {"image_grid_thw": grid, "mm_hash": digest}
                    items.append(base64.b64encode(json.dumps(item).encode()).decode())
                    self.rendered.add(digest)
        ids += [IM_END, 198, IM_START, 77091, 198]
        features = None
        if hashes:
            features = {
                "mm_hashes": {"image": hashes},
                "mm_placeholders": {"image": places},
                "kwargs_data": {"image": items},
            }
        answer = {
            "request_id": uuid.uuid4().hex,
            "token_ids": ids,
            "features": features,
            "sampling_params": {"max_tokens": self.max_model_len - len(ids)},
            "model": body.get("model"),
            "stream": False,
            "stream_options": None,
            "cache_salt": None,
            "priority": 0,
            "kv_transfer_params": None,
        }
        return web.json_response(answer)

    def _features_refusal(self, features: Any, token_ids: list[int]) -> str | None:
        """Why vLLM would refuse (or misplace) `features` beside `token_ids`, or None: one
        hash, placeholder and tensor item per image, each placeholder over an `<|image_pad|>`
        run of `token_ids` as long as its item's grid makes it, a None item only for an image
        the engine holds."""
        if not isinstance(features, dict):
            return "features: Input should be a valid dictionary"
        hashes = (features.get("mm_hashes") or {}).get("image")
        places = (features.get("mm_placeholders") or {}).get("image")
        kwargs = features.get("kwargs_data")
        items = [None] * len(hashes or []) if kwargs is None else kwargs.get("image")
        if not isinstance(hashes, list) or not isinstance(places, list):
            return "features: mm_hashes and mm_placeholders are required"
        if not isinstance(items, list) or not len(hashes) == len(places) == len(items):
            return "features: mm_hashes, mm_placeholders and kwargs_data differ in length"
        for digest, place, item in zip(hashes, places, items, strict=True):
            at, n = place.get("offset"), place.get("length")
            whole = isinstance(at, int) and isinstance(n, int)
            if not whole or not 0 <= at <= at + n <= len(token_ids):
                return f"placeholder {place} is outside the {len(token_ids)} prompt tokens"
            if token_ids[at : at + n] != [IMAGE_PAD] * n:
                return f"placeholder {place} is not over the prompt's image tokens"
            if item is None:
                if digest not in self.held:
                    return f"Expected a cached item for mm_hash='{digest}'"
                held = self.held[digest]
            else:
                held = json.loads(base64.b64decode(item))
                if held["mm_hash"] != digest:
                    return "kwargs_data item is not the hash's"
            t, h, w = held["image_grid_thw"]
            if t * h * w // self.merge_size**2 != n:
                return (
                    f"Attempted to assign {t * h * w // self.merge_size**2} multimodal tokens "
                    f"to {n} placeholders"
                )
            self.held[digest] = held
        return None

    async def _generate_tokens(self, request: web.Request) -> web.StreamResponse:
        """`ServingTokens.serve_tokens`: `token_ids`, `features` and vLLM's `SamplingParams`
        in; each choice's `token_ids` and `logprobs.content` out (deltas when streamed)."""
        body = await self._record(request)
        rid = request.headers.get("X-Request-Id", uuid.uuid4().hex)
        failed = await self._failing(rid)
        if failed is not None:
            return failed
        token_ids = body.get("token_ids")
        if not isinstance(token_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in token_ids
        ):
            return _vllm_error("token_ids: Input should be a valid list of integers", 400)
        params = body.get("sampling_params")
        if not isinstance(params, dict):
            return _vllm_error("sampling_params: Field required", 400)
        unknown = sorted(set(params) - VLLM_SAMPLING_PARAMS)
        if unknown:
            return _vllm_error(f"sampling_params: unknown fields {unknown}", 400)
        if body.get("features") is not None:
            refusal = self._features_refusal(body["features"], token_ids)
            if refusal is not None:
                return _vllm_error(refusal, 400)
        ids, logprobs, finish = self._truncate(token_ids, params.get("max_tokens"))
        versions, aborted = await self._sample(len(ids))
        if aborted:
            ids, logprobs, finish = ids[: len(versions)], logprobs[: len(versions)], "abort"
        content = None
        if params.get("logprobs") is not None:
            # vllm 0.32 `GenerateLogProbsContent`: integer ids (the route has no tokenizer).
            content = [
                {
                    "token_id": t,
                    "logprob": lp,
                    "rank": 1,
                    "top_logprobs": [{"token_id": t, "logprob": lp, "rank": 1}],
                }
                for t, lp in zip(ids, logprobs, strict=True)
            ]
        usage = {
            "prompt_tokens": len(token_ids),
            "completion_tokens": len(ids),
            "total_tokens": len(token_ids) + len(ids),
        }
        request_id = f"generate-tokens-{body.get('request_id') or rid}"
        # Contiguous spans over the output, on the whole answer and the stream's last chunk.
        spans = version_spans(versions)
        answer = {
            "request_id": request_id,
            "choices": [
                {
                    "index": 0,
                    "logprobs": None if content is None else {"content": content},
                    "finish_reason": finish,
                    "token_ids": ids,
                    "weight_versions": spans,
                }
            ],
            "usage": usage,
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
        self.answered.append(answer)
        if not body.get("stream"):
            return await self._answer(request, answer, rid)

        def event(start: int, end: int, last: bool) -> Any:
            part = None if content is None else {"content": content[start:end]}
            choice = {
                "index": 0,
                "logprobs": part,
                "finish_reason": finish if last else None,
                "token_ids": ids[start:end],
                "weight_versions": spans if last else None,
            }
            return {"request_id": request_id, "choices": [choice]}

        async def stalled() -> Any:
            await asyncio.sleep(HANG_LIMIT_S)  # vLLM stops when the client goes
            return None

        options = body.get("stream_options") or {}
        after = [{"request_id": request_id, "choices": [], "usage": usage}]
        return await self._stream(
            request, rid, len(ids), event, stalled, after if options.get("include_usage") else []
        )

    def _refusal(self, prompt: int, params: dict[str, Any]) -> web.Response | None:
        """vLLM's 400 for a prompt over `max_model_len` and for a `top_p` out of (0, 1], with
        its messages (vllm 0.32 `renderers`, `sampling_params.py`)."""
        if prompt > self.max_model_len:
            return _vllm_error(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt contains {prompt} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={prompt})",
                400,
            )
        top_p = params.get("top_p", 1.0)
        if not 0.0 < top_p <= 1.0:
            return _vllm_error(
                f"top_p must be in (0, 1], got {float(top_p)}. (parameter=top_p, value={top_p})",
                400,
            )
        return None

    async def _weight_info(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.weight_version})

    async def _is_paused(self, request: web.Request) -> web.Response:
        self.dev_calls.append((request.path_qs, None))
        return web.json_response({"is_paused": self.paused is not None})

    async def _dev(self, request: web.Request) -> web.Response:
        """The weight push's routes, with vLLM 0.32's answers (`entrypoints/rl/online`,
        `serve/dev/rpc`, `serve/dev/cache`)."""
        body = await request.json() if request.can_read_body else None
        self.dev_calls.append((request.path_qs, body))
        if request.path == "/pause":
            mode = request.query.get("mode", "abort")
            if mode not in ("abort", "wait", "keep"):
                return _vllm_error(f"Invalid pause mode: {mode}", 422)
            self.paused, self._resumed = mode, asyncio.Event()
            if mode == "abort":
                self._aborts += 1
            await asyncio.sleep(0.02)  # as `pause_generation` does: the aborts' answers out
            return web.json_response({"status": "paused"})
        if request.path == "/resume":
            self.paused = None
            self._resumed.set()
            return web.json_response({"status": "resumed"})
        if request.path == "/update_weight_version":
            self.weight_version = str(body["new_version"])
            return web.json_response({"success": True, "new_version": self.weight_version})
        if request.path == "/reset_prefix_cache":
            return web.json_response({"success": True})
        await asyncio.sleep(self.reload_s)  # /collective_rpc
        return web.json_response({"results": [None]})

    async def _sample(self, n: int) -> tuple[list[str], bool]:
        """The weight version of each of `n` tokens sampled one by one (`token_s` apart), and
        whether a `/pause?mode=abort` stopped the request first."""
        while self.paused is not None:
            await self._resumed.wait()
        aborts, versions = self._aborts, []
        for _ in range(n):
            if self.token_s:
                await asyncio.sleep(self.token_s)
            while self.paused == "keep":
                await self._resumed.wait()
            if self._aborts != aborts:
                return versions, True
            versions.append(self.weight_version)
        return versions, False

    async def _failing(self, rid: str) -> web.Response | None:
        """The `fail` answer, or after the `hang`, None: what `mode` makes of a request."""
        if self.mode == "fail":
            return _vllm_error(self.fail_message, self.fail_status, "InternalServerError")
        if self.mode == "hang":
            try:
                await asyncio.sleep(HANG_LIMIT_S)
            except asyncio.CancelledError:
                self.disconnected.append(rid)
                raise
        return None

    async def _models(self, request: web.Request) -> web.Response:
        await self._record(request)
        card = {
            "id": self.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": self.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def _completions(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        rid = request.headers.get("X-Request-Id", uuid.uuid4().hex)
        failed = await self._failing(rid)
        if failed is not None:
            return failed
        structured = body.get("structured_outputs")
        if structured is not None:
            given = [
                k for k in VLLM_CONSTRAINTS if isinstance(structured, dict) and k in structured
            ]
            if len(given) != 1:
                error = {
                    "message": "You must use one kind of structured outputs constraint",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
                return web.json_response({"error": error}, status=400)
        prompt = body["prompt"]
        refusal = self._refusal(len(prompt), body)
        if refusal is not None:
            return refusal
        ids, logprobs, finish = self._truncate(prompt, body.get("max_tokens"))
        versions, aborted = await self._sample(len(ids))
        if aborted:
            ids, logprobs, finish = ids[: len(versions)], logprobs[: len(versions)], "abort"
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
        if self.routing is not None:
            start = min(body.get("routed_experts_prompt_start", 0), len(prompt))
            rows, _ = self.routing.serve(prompt, ids, start, len(self.requests))
            # uint8 up to 256 experts, else uint16 (routed_experts_capturer.py).
            small = self.routing.shape.num_experts <= 256
            buffer = io.BytesIO()
            np.save(buffer, rows.astype(np.uint8 if small else np.uint16), allow_pickle=False)
            choice["routed_experts"] = base64.b64encode(buffer.getvalue()).decode("ascii")
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt) + len(ids),
        }
        answer = {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [choice],
            "usage": usage,
        }
        self.answered.append(answer)
        if body.get("stream"):
            return await self._stream_completions(request, rid, answer, body)
        return await self._answer(request, answer, rid)

    async def _stream_completions(
        self, request: web.Request, rid: str, answer: dict[str, Any], body: dict[str, Any]
    ) -> web.StreamResponse:
        """vLLM's completion stream (serving_completion `completion_stream_generator`): each
        chunk's choice holds its new `token_ids` and logprobs; the first also the
        `prompt_token_ids`, the terminal one `finish_reason` (no `weight_versions`: vLLM 0.32
        ignores `return_weight_versions`); with `stream_options.include_usage`, a last chunk
        with no choices and the usage."""
        whole = answer["choices"][0]
        ids, lp = whole["token_ids"], whole["logprobs"]

        def chunk(choice: dict[str, Any], usage: Any = None) -> dict[str, Any]:
            out = {
                "id": answer["id"],
                "object": "text_completion",
                "created": answer["created"],
                "model": answer["model"],
                "choices": [choice] if choice else [],
            }
            if usage is not None:  # vLLM leaves the key out of the other chunks
                out["usage"] = usage
            return out

        def event(start: int, end: int, last: bool) -> Any:
            choice: dict[str, Any] = {
                "index": 0,
                "text": "",
                "logprobs": {
                    "text_offset": lp["text_offset"][start:end],
                    "token_logprobs": lp["token_logprobs"][start:end],
                    "tokens": lp["tokens"][start:end],
                    "top_logprobs": lp["top_logprobs"][start:end],
                },
                "finish_reason": whole["finish_reason"] if last else None,
                "stop_reason": None,
                "token_ids": ids[start:end],
            }
            if start == 0:
                choice["prompt_token_ids"] = whole["prompt_token_ids"]
            return chunk(choice)

        async def stalled() -> Any:
            await asyncio.sleep(HANG_LIMIT_S)  # vLLM stops when the client goes
            return None

        options = body.get("stream_options") or {}
        after = [chunk({}, answer["usage"])] if options.get("include_usage") else []
        return await self._stream(request, rid, len(ids), event, stalled, after)
