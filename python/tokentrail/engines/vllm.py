"""vLLM through its OpenAI `/v1/completions` endpoint with a token-id prompt, and a prompt with
images through `/v1/chat/completions/render` and `/inference/v1/generate` (`vllm_generate`).

`return_token_ids` gives the sampled ids (stop token included) and `logprobs: 0` the sampled
token's logprob. `/inference/v1/generate` answers the weight versions over the output;
`/v1/completions` does not (vLLM 0.32 has no `return_weight_versions`), so a text turn's version
is the one `GET /weight_info` names before and after it (a server with `VLLM_SERVER_DEV_MODE=1`,
whose RL routes update weights), or vLLM's initial `default` on a server without those routes,
whose weights nothing can change. `GET /v1/models`' `max_model_len` is the served context. The
render and tokens routes need `--enable-scale-out` (a 403 without). A server launched
with `--enable-return-routed-experts` adds each choice's routed experts (base64 of a `.npy`),
from `routed_experts_prompt_start` on; vLLM has no indexer top-k. vLLM aborts a request when
its connection closes, so aborting is cancelling.

`vllm-tokens://HOST:PORT` sends every turn, text too, to the tokens route, whose answer names
the weight version of every output token (`weight_versions` spans): a turn sampled while
`/pause?mode=keep`, a weight reload and `/resume` happened holds tokens of two versions, and
the sample says which. That is the spec for RL with weights pushed while turns are in flight;
the server needs `--enable-scale-out` (and `VLLM_SERVER_DEV_MODE=1` for the weight routes).
A turn vLLM aborts on its own (`/pause?mode=abort`) is generated again once it serves
(`abort_retry`); the aborted attempt's tokens are recorded beside it, never trained.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

from tokentrail.compat import cancelling
from tokentrail.core.routing import ReplayRows, checked_rows, weight_spans
from tokentrail.engines.abort_retry import ABORT_RETRIES, AbortRetry
from tokentrail.engines.base import GenerateRequest, Generation, token_list
from tokentrail.engines.bound import answer_limit
from tokentrail.engines.http import HTTPEngine, base_url, parse_off_loop
from tokentrail.engines.registry import register_engine
from tokentrail.engines.streaming import Event, TokenSink
from tokentrail.engines.vllm_generate import (
    GENERATE_PATH,
    RENDER_PATH,
    as_completion,
    generate_body,
    placed_features,
    render_body,
    render_limit,
    sampling_params,
)
from tokentrail.engines.wire_rows import Base64, decode_npy_base64
from tokentrail.errors import EngineError, EngineOutputError
from tokentrail.kinds import EngineFault, Replay, ReplayGap
from tokentrail.text.tokenizer import LoadedTokenizer

logger = logging.getLogger(__name__)

T = TypeVar("T")

MODELS_TIMEOUT_S = 30.0
WEIGHT_INFO_PATH = "/weight_info"
# The version vLLM names the weights it started with (`v1/engine/core.py`).
DEFAULT_WEIGHT_VERSION = "default"


class VLLMEngine(HTTPEngine):
    """A client of one vLLM OpenAI-compatible server at `base_url`.

    Wire format (vllm `entrypoints/openai/protocol.py`, `serving_completion.py`): request
    `{"model", "prompt": [ids], "max_tokens", "temperature", "top_p", "top_k", "stop", "seed",
    "logprobs": 0, "return_token_ids": true, "skip_special_tokens": false,
    "include_stop_str_in_output": true, "stream": false}`; answer `{"choices": [{"token_ids",
    "prompt_token_ids", "logprobs": {"token_logprobs": [...]}, "finish_reason"}], "usage"}`;
    errors `{"error": {"message", "type", "code"}}` (older: `{"object": "error", "message"}`).
    A forced tool call goes as `structured_outputs: {"regex": ...}`. A prompt with images goes
    to the tokens endpoint instead (`vllm_generate`; a vLLM whose render route answers the
    images' `kwargs_data`, 0.21 and later); its answer is read as this one.

    There is no abort endpoint: vLLM's `with_cancellation` cancels a non-streaming request when
    the client disconnects, so `abort(rid)` cancels the in-flight HTTP call and `generate`
    returns an empty `abort` generation.
    """

    name = "vllm"
    # `structured_outputs.regex` (the `guided_*` keys are ignored by vLLM >= 0.12).
    supports_constraints = True
    # Through `/inference/v1/generate` with the images' rendered features (`vllm_generate`).
    supports_images = True

    def __init__(
        self,
        base_url: str,
        tokenizer: LoadedTokenizer | None = None,
        *,
        model: str | None = None,
        timeout: float = 600.0,
        stream: bool = False,
        tokens_route: bool = False,
        abort_retries: int = ABORT_RETRIES,
    ) -> None:
        super().__init__(base_url, timeout=timeout)
        self.tokenizer = tokenizer
        self.model = model
        # Whether `generate` streams from the engine (`generate_streaming` always does).
        self.stream = stream
        # Whether text turns go to the tokens route too (`vllm-tokens://`), for their
        # per-token weight versions.
        self.tokens_route = tokens_route
        self._inflight: dict[str, asyncio.Task[Any]] = {}
        self._aborted: set[str] = set()
        # A turn vLLM aborted itself is generated again, up to `abort_retries` times.
        self.retry = AbortRetry(
            partial(self._request_json, "GET"), retries=abort_retries, timeout_s=timeout
        )
        # The served model's `max_model_len` once `GET /v1/models` was read (0: none given).
        self._served_context: int | None = None
        # Whether the server answers `GET /weight_info` (None: not asked yet).
        self._weight_info: bool | None = None

    async def model_name(self) -> str:
        """The served model: the one given, else the first id of `GET /v1/models` (cached)."""
        if self.model is None:
            await self._read_models()
        assert self.model is not None
        return self.model

    async def served_context(self) -> int:
        """The served model's `max_model_len` in `GET /v1/models` (0: not given): what
        `--max-model-len` set, which can be below the model's `max_position_embeddings`."""
        if self._served_context is None:
            await self._read_models()
        assert self._served_context is not None
        return self._served_context

    async def _read_models(self) -> None:
        data = await self._request_json("GET", "/v1/models", timeout=MODELS_TIMEOUT_S)
        models = data.get("data") if isinstance(data, dict) else None
        if not models or not all(isinstance(m, dict) and "id" in m for m in models):
            raise EngineError("vllm: GET /v1/models lists no model")
        card = next((m for m in models if m["id"] == self.model), models[0])
        if self.model is None:
            self.model = str(card["id"])
        length = card.get("max_model_len")
        valid = isinstance(length, int) and not isinstance(length, bool) and length > 0
        self._served_context = length if valid else 0

    async def weight_version(self) -> str:
        """The version of the weights the server samples with now: what `GET /weight_info`
        names (a server with `VLLM_SERVER_DEV_MODE=1`, whose routes update weights), else
        `default`, vLLM's name for the weights it started with, which a server without those
        routes keeps (asked once: a 404 is remembered)."""
        if self._weight_info is False:
            return DEFAULT_WEIGHT_VERSION
        try:
            data = await self._request_json("GET", WEIGHT_INFO_PATH, timeout=MODELS_TIMEOUT_S)
        except EngineError as exc:
            if exc.engine_status != 404:
                raise
            self._weight_info = False
            return DEFAULT_WEIGHT_VERSION
        self._weight_info = True
        version = data.get("weight_version") if isinstance(data, dict) else None
        if not isinstance(version, str) or not version:
            raise EngineError(f"vllm: GET {WEIGHT_INFO_PATH} names no weight_version")
        return version

    async def _versioned(self, run: Callable[[], Awaitable[Generation]]) -> Generation:
        """`run()`'s generation with its weight versions: the answer's spans where it has them
        (`/inference/v1/generate`), else the server's version when it was the same before and
        after the call (a weight update in between leaves them unknown, with a warning)."""
        before = await self.weight_version()
        generation = await run()
        if generation.weight_versions:
            return generation
        after = await self.weight_version()
        if after != before:
            logger.warning(
                "vllm's weights went from version %s to %s during a turn: which sampled its "
                "tokens is unknown",
                before,
                after,
            )
            return generation
        spans = weight_spans(before, None, len(generation.output_ids))
        return dataclasses.replace(generation, weight_versions=spans)

    def request_body(self, req: GenerateRequest, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "prompt": token_list(req.input_ids),
            **sampling_params(req),
            "return_token_ids": True,
            "stream": False,
        }

    async def generate(self, req: GenerateRequest) -> Generation:
        if self.stream:
            return await self.generate_streaming(req, _ignore)
        whole = partial(self._versioned, partial(self._generate_whole, req))
        return await self.retry.run(req.request_id, whole)

    async def _call(
        self, req: GenerateRequest, model: str, read: Callable[[Any, dict[str, memoryview]], T]
    ) -> T:
        """`read` of one whole answer in `/v1/completions`' shape: from `/v1/completions`, or
        for a prompt with images from `/inference/v1/generate` after rendering them. Rows, or
        a long turn, take a while to read: off the event loop."""
        off_loop = req.replay.asks_rows() or parse_off_loop(req)
        if not (req.images or self.tokens_route):
            return await self._request_read(
                "POST",
                "/v1/completions",
                read,
                self.request_body(req, model),
                self._headers(req),
                max_bytes=answer_limit(req, echoes_prompt=True),
                lift=req.replay.asks_rows(),
                off_loop=off_loop,
            )
        body = await self.tokens_body(req, model)
        try:
            return await self._request_read(
                "POST",
                GENERATE_PATH,
                lambda data, lifted: read(as_completion(data), lifted),
                body,
                self._headers(req),
                max_bytes=answer_limit(req),
                lift=req.replay.asks_rows(),
                off_loop=off_loop,
            )
        except EngineError as exc:
            if exc.engine_status == 403:
                raise scale_out_refusal(self.base_url, exc) from None
            raise

    async def tokens_body(self, req: GenerateRequest, model: str) -> dict[str, Any]:
        """The `/inference/v1/generate` body: a text prompt's ids as they are, a prompt with
        images with the images rendered (`image_body`)."""
        if req.images:
            return await self.image_body(req, model)
        return generate_body(req, model)

    async def image_body(self, req: GenerateRequest, model: str) -> dict[str, Any]:
        """The `/inference/v1/generate` body for a prompt with images: the images rendered by
        vLLM's own processor, placed at the prompt's image runs."""
        try:
            rendered, _ = await self._request_answer(
                "POST",
                RENDER_PATH,
                render_body(model, req.images),
                self._headers(req),
                max_bytes=render_limit(req.images),
            )
        except EngineError as exc:
            if exc.engine_status == 403:
                raise scale_out_refusal(self.base_url, exc) from None
            if exc.engine_status != 404:
                raise
            raise EngineError(
                f"vllm at {self.base_url} serves no {RENDER_PATH} (a vLLM before 0.20): a prompt "
                f"with images needs it and {GENERATE_PATH}; serve a newer vLLM, or use sglang://",
                404,
            ) from None
        return generate_body(req, model, placed_features(rendered, req))

    async def _generate_whole(self, req: GenerateRequest) -> Generation:
        start = time.perf_counter()
        model = await self.model_name()
        call = asyncio.ensure_future(self._call(req, model, partial(_read_whole, req, start)))
        self._inflight[req.request_id] = call
        try:
            return await call
        except asyncio.CancelledError:
            if req.request_id in self._aborted and not cancelling(asyncio.current_task()):
                # `abort` cancelled the call and closed its connection; nothing was sampled
                # that vLLM will report.
                return Generation([], [], "abort", len(req.input_ids), time.perf_counter() - start)
            call.cancel()  # our caller was cancelled: dropping the connection aborts in vLLM
            raise
        finally:
            self._inflight.pop(req.request_id, None)
            self._aborted.discard(req.request_id)

    async def generate_streaming(self, req: GenerateRequest, sink: TokenSink) -> Generation:
        """`/v1/completions` with `stream: true`: each chunk's `token_ids` and
        `logprobs.token_logprobs` (deltas) go to `sink` as they arrive; the terminal chunk
        brings `finish_reason` (and from `/inference/v1/generate` `weight_versions`), the usage
        chunk the prompt count. The `Generation` equals the non-streamed one for the same
        tokens. vLLM sends routed experts only on a whole answer, so a turn that asks for them
        is generated whole, its tokens handed to `sink` at the end. Aborted (`abort`), it
        returns what was streamed so far; aborted by vLLM before a token went to `sink`, it
        is generated again (`abort_retry`)."""
        sent = [0]

        def counted(ids: Sequence[int], logprobs: Sequence[float]) -> None:
            sent[0] += len(ids)
            sink(ids, logprobs)

        streamed = partial(self._versioned, partial(self._generate_streamed, req, counted))
        return await self.retry.run(
            req.request_id, streamed, lambda: sink is _ignore or not sent[0]
        )

    async def _generate_streamed(self, req: GenerateRequest, sink: TokenSink) -> Generation:
        if req.replay.routed_start is not None:
            generation = await self._generate_whole(req)
            if generation.output_ids:
                sink(generation.output_ids, generation.logprobs)
            return generation
        start = time.perf_counter()
        model = await self.model_name()
        capture = StreamCapture(req, sink)
        call = asyncio.ensure_future(self._stream(req, model, capture))
        self._inflight[req.request_id] = call
        try:
            await call
        except asyncio.CancelledError:
            if req.request_id in self._aborted and not cancelling(asyncio.current_task()):
                # `abort` closed the connection (vLLM stops the request on it): what was
                # streamed is what was sampled.
                capture.finish = "abort"
            else:
                call.cancel()
                raise
        finally:
            self._inflight.pop(req.request_id, None)
            self._aborted.discard(req.request_id)
        return parse_completion_response(capture.final(), req, time.perf_counter() - start)

    async def _stream(self, req: GenerateRequest, model: str, capture: StreamCapture) -> None:
        """One streamed answer into `capture`: from `/v1/completions`, or for a prompt with
        images from `/inference/v1/generate` (its chunks read in `/v1/completions`' shape)."""
        if req.images or self.tokens_route:
            path, body = GENERATE_PATH, await self.tokens_body(req, model)
            limit = answer_limit(req)
            capture.shape = as_completion
        else:
            path, body = "/v1/completions", self.request_body(req, model)
            limit = answer_limit(req, echoes_prompt=True)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        try:
            await self._request_stream(path, body, self._headers(req), limit, capture)
        except EngineError as exc:
            if (req.images or self.tokens_route) and exc.engine_status == 403:
                raise scale_out_refusal(self.base_url, exc) from None
            raise

    async def abort(self, request_id: str) -> None:
        self.retry.stop(request_id)  # the harness's abort: not generated again
        call = self._inflight.get(request_id)
        if call is None or call.done():
            return
        self._aborted.add(request_id)
        call.cancel()
        try:
            await asyncio.wait({call}, timeout=5.0)
        except Exception as exc:  # best effort, never raises
            logger.debug("vllm: abort of %s: %s", request_id, exc)


def _read_whole(
    req: GenerateRequest, start: float, data: Any, lifted: dict[str, memoryview]
) -> Generation:
    """The `Generation` of a whole answer, timed from `start`."""
    return parse_completion_response(data, req, time.perf_counter() - start, lifted)


def _ignore(ids: object, logprobs: object) -> None:
    return None


def scale_out_refusal(base_url: str, exc: EngineError) -> EngineError:
    """What a 403 from the render or tokens route means: vLLM (0.32) serves them only when
    started with `--enable-scale-out` (or `--tokens-only`); a prompt with images needs both,
    every turn of `vllm-tokens://` the tokens route."""
    return EngineError(
        f"vllm at {base_url} refuses {RENDER_PATH} and {GENERATE_PATH}, which a prompt with "
        f"images and every turn of vllm-tokens:// need: start vLLM with --enable-scale-out "
        f"({exc.message})",
        403,
    )


class StreamCapture:
    """The tokens of one streamed `/v1/completions`, taken chunk by chunk: every chunk's
    choice holds only its new `token_ids` and `logprobs.token_logprobs`; the first also
    `prompt_token_ids`, the terminal one `finish_reason` (and `weight_versions` when asked);
    with `stream_options.include_usage` a last chunk with no choices holds `usage`."""

    def __init__(self, req: GenerateRequest, sink: TokenSink) -> None:
        self.req = req
        self.sink = sink
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish: str | None = None
        self.prompt_ids: list[int] | None = None
        self.weight_versions: Any = None
        self.usage: Any = None
        self.limit = req.sampling.max_new_tokens + 1  # an end-of-turn token past the budget
        # A chunk of the tokens route in `/v1/completions`' shape (`as_completion`).
        self.shape: Callable[[Any], Any] | None = None
        # Taken since the sink was last called.
        self.pending_ids: list[int] = []
        self.pending_logprobs: list[float] = []

    def take_run(self, events: Sequence[Event], decode: Callable[[Event], Any]) -> None:
        """Take the chunks that arrived together and hand their tokens to the sink at once."""
        shape = self.shape
        for event in events:
            obj = decode(event)
            self.take(shape(obj) if shape is not None else obj)
        if self.pending_ids:
            ids, logprobs = self.pending_ids, self.pending_logprobs
            self.pending_ids, self.pending_logprobs = [], []
            self.sink(ids, logprobs)

    def take(self, obj: Any) -> None:
        if not isinstance(obj, dict):
            raise EngineError("vllm stream chunk is not an object")
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        choices = obj.get("choices")
        if not isinstance(choices, list):
            raise EngineError("vllm stream chunk has no choices")
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            self._take_choice(choice)

    def _take_choice(self, choice: dict[str, Any]) -> None:
        ids = choice.get("token_ids")
        if ids is None:
            ids = []
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids
        ):
            raise EngineError(
                "vllm stream chunk has no choices[0].token_ids (a vLLM without return_token_ids?)"
            )
        lp = choice.get("logprobs")
        logprobs = lp.get("token_logprobs") if isinstance(lp, dict) else None
        if logprobs is None and not ids:
            logprobs = []
        if not isinstance(logprobs, list) or not all(
            isinstance(x, int | float) and not isinstance(x, bool) for x in logprobs
        ):
            raise EngineError("vllm stream chunk has no choices[0].logprobs.token_logprobs")
        if len(logprobs) != len(ids):
            raise EngineError(
                f"vllm streamed {len(ids)} token ids but {len(logprobs)} logprobs in one chunk"
            )
        if isinstance(choice.get("prompt_token_ids"), list):
            self.prompt_ids = choice["prompt_token_ids"]
        if choice.get("weight_versions") is not None:
            self.weight_versions = choice["weight_versions"]
        if choice.get("finish_reason") is not None:
            self.finish = choice["finish_reason"]
        floats = [float(x) for x in logprobs]
        self.ids.extend(ids)
        self.logprobs.extend(floats)
        if len(self.ids) > self.limit:
            raise EngineOutputError(
                EngineFault.TOO_LONG,
                f"vllm streamed {len(self.ids)} tokens, more than max_tokens="
                f"{self.req.sampling.max_new_tokens} allows",
            )
        self.pending_ids.extend(ids)
        self.pending_logprobs.extend(floats)

    def final(self) -> dict[str, Any]:
        """The non-streamed answer these chunks add up to."""
        if self.finish is None:
            raise EngineError("vllm stream ended before its terminal chunk (no finish_reason)")
        choice: dict[str, Any] = {
            "index": 0,
            "token_ids": self.ids,
            "logprobs": {"token_logprobs": self.logprobs},
            "finish_reason": self.finish,
        }
        if self.prompt_ids is not None:
            choice["prompt_token_ids"] = self.prompt_ids
        if self.weight_versions is not None:
            choice["weight_versions"] = self.weight_versions
        answer: dict[str, Any] = {"choices": [choice]}
        if self.usage is not None:
            answer["usage"] = self.usage
        return answer


def parse_completion_response(
    data: Any, req: GenerateRequest, elapsed: float, lifted: Mapping[str, Base64] | None = None
) -> Generation:
    """A `Generation` from a non-streaming `/v1/completions` answer; `lifted` holds the routed
    experts' base64 taken out of it before parsing, by placeholder (`wire_rows.lift_base64`)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise EngineError("vllm answer has no choices")
    choice = choices[0]
    ids = choice.get("token_ids")
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in ids
    ):
        raise EngineError(
            "vllm answer has no choices[0].token_ids (a vLLM without return_token_ids?)"
        )
    lp = choice.get("logprobs")
    logprobs = lp.get("token_logprobs") if isinstance(lp, dict) else None
    if not isinstance(logprobs, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in logprobs
    ):
        raise EngineError("vllm answer has no choices[0].logprobs.token_logprobs")
    if len(logprobs) != len(ids):
        raise EngineError(f"vllm returned {len(ids)} token ids but {len(logprobs)} logprobs")

    finish = choice.get("finish_reason")
    if finish not in ("stop", "length", "abort"):
        raise EngineError(f"vllm answer has an unknown finish_reason {finish!r}")

    prompt_ids = choice.get("prompt_token_ids")
    if isinstance(prompt_ids, list) and prompt_ids != token_list(req.input_ids):
        logger.warning(
            "vllm saw a prompt of %d tokens for request %s, tokentrail sent %d different ones",
            len(prompt_ids),
            req.request_id,
            len(req.input_ids),
        )
    usage = data.get("usage")
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if not isinstance(prompt_tokens, int):
        prompt_tokens = len(req.input_ids)
    spans = choice.get("weight_versions")
    last = spans[-1].get("version") if isinstance(spans, list) and spans else None
    return Generation(
        list(ids),
        [float(x) for x in logprobs],
        finish,
        prompt_tokens,
        elapsed,
        routed_experts=_routed_experts(choice, req, prompt_tokens, len(ids), lifted or {}),
        indexer_topk=req.replay.unsupported()[1],
        weight_versions=weight_spans(last, spans, len(ids), req.request_id),
    )


def _routed_experts(
    choice: dict[str, Any],
    req: GenerateRequest,
    prompt: int,
    output: int,
    lifted: Mapping[str, Base64],
) -> ReplayRows | None:
    """A choice's `routed_experts`: base64 of a `.npy` file (uint8 up to 256 experts, else
    uint16), shaped `[rows, layers, top_k]` from the prompt start on."""
    replay = req.replay
    if replay.routed_start is None or replay.routing is None:
        return None
    raw = choice.get("routed_experts")
    if isinstance(raw, str):
        raw = lifted.get(raw, raw)
    if not isinstance(raw, str | memoryview):
        logger.warning(
            "vllm returned no routed_experts for request %s (a server without "
            "--enable-return-routed-experts?)",
            req.request_id,
        )
        return ReplayRows.missing(ReplayGap.ENGINE_RETURNED_NONE)
    rows = decode_npy_base64(raw, replay.routing.dtype)
    if isinstance(rows, str):
        logger.warning("vllm routed_experts of request %s: %s", req.request_id, rows)
        return ReplayRows.missing(ReplayGap.SHAPE_MISMATCH)
    return checked_rows(
        Replay.ROUTED_EXPERTS,
        rows,
        start=min(replay.routed_start, prompt),
        prompt_tokens=prompt,
        output_tokens=output,
        shape=replay.routing,
        request_id=req.request_id,
    )


@register_engine("vllm", "vllm://HOST:PORT")
def _from_spec(spec: str, address: str, tokenizer: LoadedTokenizer, timeout: float) -> VLLMEngine:
    return VLLMEngine(base_url(spec, address), tokenizer, timeout=timeout)


@register_engine("vllm-tokens", "vllm-tokens://HOST:PORT")
def _tokens_from_spec(
    spec: str, address: str, tokenizer: LoadedTokenizer, timeout: float
) -> VLLMEngine:
    return VLLMEngine(base_url(spec, address), tokenizer, timeout=timeout, tokens_route=True)
