"""SGLang through its native `/generate` endpoint: token ids in, ids and logprobs out.

Output ids and logprobs both come from `meta_info.output_token_logprobs`; the stop token stays in
them. Routed experts (`return_routed_experts`, from `routed_experts_start_len` on) and indexer
top-k (`return_indexer_topk`) come back as base64 of little-endian int32 rows, decoded into
the store's element type (`engines.wire_rows`); the weight
version is `meta_info.weight_version` (with `weight_versions` spans from 0.5.20). A cancelled
`generate` sends `/abort_request` so the engine frees the slot at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tokentrail.core.ids import INTS, NUMBERS, only_types
from tokentrail.core.routing import ReplayRows, checked_rows, weight_spans
from tokentrail.engines.base import GenerateRequest, Generation, token_list
from tokentrail.engines.bound import answer_limit
from tokentrail.engines.http import HTTPEngine, base_url, parse_off_loop
from tokentrail.engines.registry import register_engine
from tokentrail.engines.sglang_events import FastEvents
from tokentrail.engines.streaming import Event, TokenSink
from tokentrail.engines.wire_json import Rows
from tokentrail.engines.wire_rows import Base64, decode_int32_base64
from tokentrail.errors import EngineError, EngineOutputError
from tokentrail.kinds import EngineFault, Replay, ReplayGap
from tokentrail.text.tokenizer import LoadedTokenizer

logger = logging.getLogger(__name__)

ABORT_TIMEOUT_S = 5.0


class SGLangEngine(HTTPEngine):
    """A client of one SGLang server or SGLang Model Gateway (router) at `base_url`.

    Wire format (sglang `io_struct.GenerateReqInput`, `http_server.py`):
    request `{"input_ids", "sampling_params", "return_logprob": true, "logprob_start_len": -1,
    "rid", "stream": false}`; answer `{"text", "output_ids", "meta_info": {"id",
    "finish_reason": {"type": "stop"|"length"|"abort", ...}, "prompt_tokens",
    "completion_tokens", "output_token_logprobs": [[logprob, token_id, text|null], ...]}}`;
    errors `{"error": {"message"}}` with HTTP 400. The session id goes in `X-SMG-Routing-Key`.
    A forced tool call goes as `sampling_params.regex` (a string; SGLang takes at most one of
    `json_schema`, `regex`, `ebnf`, `structural_tag`).

    Replay (top-level request keys, never in `sampling_params`, which 0.5.22+ checks):
    `return_routed_experts` with `routed_experts_start_len` S (absolute, 0 <= S <= prompt; the
    server needs `--enable-return-routed-experts`) gives `meta_info.routed_experts`, rows for
    positions S..prompt+completion-1; `return_indexer_topk` gives `meta_info.indexer_topk`
    from position 0 (`--enable-return-indexer-topk`).
    """

    name = "sglang"
    # `sampling_params.regex` (xgrammar); one constraint per request, as a string.
    supports_constraints = True
    # `/generate` takes `image_data` beside `input_ids`.
    supports_images = True

    def __init__(
        self,
        base_url: str,
        tokenizer: LoadedTokenizer | None = None,
        *,
        timeout: float = 600.0,
        stream: bool = False,
    ) -> None:
        super().__init__(base_url, timeout=timeout)
        self.tokenizer = tokenizer
        # Whether `generate` streams from the engine (`generate_streaming` always does).
        self.stream = stream
        # Whether a cumulative stream was met (and said, once per engine).
        self.said_cumulative = False

    def request_body(self, req: GenerateRequest) -> dict[str, Any]:
        s = req.sampling
        params: dict[str, Any] = {
            "max_new_tokens": s.max_new_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "stop": list(s.stop),
            # Special tokens stay in the text; ids are untouched by either flag, but the text is
            # what a reader of SGLang's logs compares against.
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "no_stop_trim": True,
        }
        if s.seed is not None:
            params["sampling_seed"] = s.seed
        if req.constraint is not None:
            params["regex"] = req.constraint.regex
        body: dict[str, Any] = {
            "input_ids": token_list(req.input_ids),
            "sampling_params": params,
            "return_logprob": True,
            # -1: logprobs of output tokens only; a prompt start would cost a prefill of logits
            # and defeat the radix cache for the prompt.
            "logprob_start_len": -1,
            "rid": req.request_id,
            "stream": False,
        }
        if req.images:
            # One per image placeholder run of `input_ids`, in order, as data URLs (SGLang's
            # `GenerateReqInput.image_data` takes URLs, paths, base64 and data URLs).
            body["image_data"] = [image.data_url() for image in req.images]
        replay = req.replay
        if replay.routed_start is not None:
            body["return_routed_experts"] = True
            # Absolute, at most the prompt's length (a larger one is a 400).
            body["routed_experts_start_len"] = min(replay.routed_start, len(body["input_ids"]))
        if replay.indexer is not None:
            body["return_indexer_topk"] = True
        return body

    async def generate(self, req: GenerateRequest) -> Generation:
        if self.stream:
            return await self.generate_streaming(req, _ignore)
        start = time.perf_counter()

        def read(data: Any, lifted: dict[str, memoryview]) -> Generation:
            return parse_generate_response(data, req, time.perf_counter() - start, lifted)

        try:
            return await self._request_read(
                "POST",
                "/generate",
                read,
                self.request_body(req),
                self._headers(req),
                # SGLang 0.5.9 to 0.5.11 send every position's rows, whatever the start.
                max_bytes=answer_limit(req, honours_start=False),
                lift=req.replay.asks_rows(),
                # Rows, or a long turn, take a while to read: off the event loop.
                off_loop=req.replay.asks_rows() or parse_off_loop(req),
            )
        except asyncio.CancelledError:
            # The client went away: closing the connection alone leaves SGLang decoding until it
            # notices, so tell it now.
            await self._abort_in_background(self.abort(req.request_id))
            raise

    async def generate_streaming(self, req: GenerateRequest, sink: TokenSink) -> Generation:
        """`/generate` with `stream: true`: each event's new tokens go to `sink` as they
        arrive; the `Generation` is parsed from the last event with every token in it, so it
        equals the non-streamed one for the same tokens. Cumulative events (SGLang's default)
        and incremental ones (`--incremental-streaming-output`) are both taken."""
        start = time.perf_counter()
        body = self.request_body(req)
        body["stream"] = True
        capture = StreamCapture(req, sink)
        try:
            await self._request_stream(
                "/generate",
                body,
                self._headers(req),
                answer_limit(req, honours_start=False),
                capture,
            )
        except asyncio.CancelledError:
            await self._abort_in_background(self.abort(req.request_id))
            raise
        elapsed = time.perf_counter() - start
        final = capture.final()
        if capture.cumulative and not self.said_cumulative:
            self.said_cumulative = True
            logger.warning(
                "sglang at %s streams cumulatively (its default): every event repeats every "
                "token so far, so reading a turn costs time quadratic in its length (a "
                "2,000-token turn is about 40 MB of events); start SGLang with "
                "--incremental-streaming-output",
                self.base_url,
            )
        if req.replay.asks_rows() or parse_off_loop(req):
            return await asyncio.to_thread(parse_generate_response, final, req, elapsed)
        return parse_generate_response(final, req, elapsed)

    async def abort(self, request_id: str) -> None:
        try:
            await self._request_json(
                "POST", "/abort_request", {"rid": request_id}, timeout=ABORT_TIMEOUT_S
            )
        except EngineError as exc:
            logger.debug("sglang: abort of %s failed: %s", request_id, exc)


def _ignore(ids: object, logprobs: object) -> None:
    return None


class StreamCapture:
    """The tokens of one streamed `/generate`, taken event by event.

    Each event carries `meta_info.completion_tokens` (all tokens so far) and either every
    `output_token_logprobs` entry so far (cumulative: SGLang's default) or only the new ones
    (`--incremental-streaming-output`, which also slices `output_ids`); the count tells which.
    The tokens of the events that arrived together go to the sink at once (`take_run`); once
    the events are known to be cumulative, only the last of those is read, and of it only
    what follows the entries already taken (`sglang_events.FastEvents`), so that what was already
    seen is not decoded again with every token.
    """

    def __init__(self, req: GenerateRequest, sink: TokenSink) -> None:
        self.req = req
        self.sink = sink
        # Every token taken: its id, its logprob.
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.last: dict[str, Any] | Event | None = None
        self.limit = req.sampling.max_new_tokens + 1  # an end-of-turn token past the budget
        self.cumulative = False
        # Taken since the sink was last called.
        self.pending_ids: list[int] = []
        self.pending_logprobs: list[float] = []
        self.fast = FastEvents(self)

    def take_run(self, events: Sequence[Event], decode: Callable[[Event], Any]) -> None:
        """Take the events that arrived together (only the last, once they are known to be
        cumulative) and hand their tokens to the sink in one call."""
        if self.cumulative:
            events = events[-1:]
        elif len(events) > 1 and self.fast.take_incremental_run(events):
            self.flush()
            return
        for event in events:
            if not self.fast.take(event):
                self.take(decode(event))
        self.flush()

    def flush(self) -> None:
        """Hand the tokens taken since the last call to the sink, in one run."""
        if self.pending_ids:
            ids, logprobs = self.pending_ids, self.pending_logprobs
            self.pending_ids, self.pending_logprobs = [], []
            self.sink(ids, logprobs)

    def take(self, obj: Any) -> None:
        """One event, as JSON: the reference `FastEvents` is held to."""
        self.fast.forget()
        if isinstance(obj, list) and len(obj) == 1:
            obj = obj[0]
        meta = obj.get("meta_info") if isinstance(obj, dict) else None
        if not isinstance(meta, dict):
            raise EngineError("sglang stream event has no meta_info")
        entries = meta.get("output_token_logprobs")
        if not isinstance(entries, list):
            raise EngineError(
                "sglang stream event has no meta_info.output_token_logprobs (return_logprob)"
            )
        total = meta.get("completion_tokens")
        have = len(self.ids)
        if not isinstance(total, int) or isinstance(total, bool):
            total = len(entries)  # no count: take the events as cumulative
        if len(entries) == total and total >= have:
            new = entries[have:]
            # An event repeating tokens already taken: every event holds all before it.
            self.cumulative = self.cumulative or (have > 0 and total > 0)
        elif have + len(entries) == total:
            new = entries
        else:
            raise EngineError(
                f"sglang stream event holds {len(entries)} output_token_logprobs with "
                f"{total} completion tokens after {have}: neither all so far nor the new ones"
            )
        ids, logprobs = _entries(new)
        self.ids.extend(ids)
        output_ids = obj.get("output_ids")
        if output_ids is not None and list(output_ids) not in (self.ids, ids):
            raise EngineError(
                f"sglang stream output_ids ({len(output_ids)} tokens) disagree with "
                f"output_token_logprobs ({len(self.ids)} so far, {len(ids)} new)"
            )
        self.add(obj, ids, logprobs)

    def add(self, last: Any, ids: list[int], logprobs: list[float]) -> None:
        """The tokens of an event taken, `last` the event (its JSON, or its bytes)."""
        if len(self.ids) > self.limit:
            raise EngineOutputError(
                EngineFault.TOO_LONG,
                f"sglang streamed {len(self.ids)} tokens, more than max_new_tokens="
                f"{self.req.sampling.max_new_tokens} allows",
            )
        self.last = last
        self.logprobs.extend(logprobs)
        self.pending_ids.extend(ids)
        self.pending_logprobs.extend(logprobs)

    def final(self) -> dict[str, Any]:
        """The non-streamed answer these events add up to."""
        self.flush()
        if self.last is None:
            raise EngineError("sglang stream ended without an event")
        last = self.last if isinstance(self.last, dict) else self.fast.whole(self.last)
        meta = dict(last["meta_info"])
        if meta.get("finish_reason") is None:
            raise EngineError("sglang stream ended before its last event (no finish_reason)")
        # The entries as rows of two columns, each of one type (every path above checked them):
        # read back by column, with no row made.
        rows: list[Any] = [None] * (2 * len(self.ids))
        rows[0::2], rows[1::2] = self.logprobs, self.ids
        meta["output_token_logprobs"] = Rows(2, rows, (float, int))
        return {"output_ids": self.ids, "meta_info": meta}


def _entries(entries: list[Any] | Rows) -> tuple[list[int], list[float]]:
    """Ids and logprobs of `output_token_logprobs` entries `[logprob, token_id, text|null]`."""
    if isinstance(entries, Rows) and entries.width >= 2:
        # Read flat, by column: no list per entry is made.
        values, tokens = entries.column(0), entries.column(1)
        if entries.types is not None and tuple(entries.types[:2]) == (float, int):
            return tokens, values  # as the core read them: floats, and ids
        if only_types(tokens, INTS) and only_types(values, NUMBERS):
            return tokens, list(map(float, values))
    ids: list[int] = []
    logprobs: list[float] = []
    for entry in entries:
        if (
            not isinstance(entry, list | tuple)
            or len(entry) < 2
            or not isinstance(entry[0], int | float)
            or isinstance(entry[1], bool)
            or not isinstance(entry[1], int)
        ):
            raise EngineError(f"sglang output_token_logprobs entry is malformed: {entry!r}")
        logprobs.append(float(entry[0]))
        ids.append(entry[1])
    return ids, logprobs


def parse_generate_response(
    data: Any, req: GenerateRequest, elapsed: float, lifted: Mapping[str, Base64] | None = None
) -> Generation:
    """A `Generation` from a non-streaming `/generate` answer; `lifted` holds the replay rows'
    base64 taken out of it before parsing, by placeholder (`wire_rows.lift_base64`)."""
    lifted = lifted or {}
    if isinstance(data, list) and len(data) == 1:
        data = data[0]  # a batch of one
    meta = data.get("meta_info") if isinstance(data, dict) else None
    if not isinstance(meta, dict):
        raise EngineError("sglang answer has no meta_info")
    entries = meta.get("output_token_logprobs")
    if not isinstance(entries, list | Rows):
        raise EngineError("sglang answer has no meta_info.output_token_logprobs (return_logprob)")
    ids, logprobs = _entries(entries)
    output_ids = data.get("output_ids")
    if output_ids is not None and list(output_ids) != ids:
        raise EngineError(
            f"sglang output_ids ({len(output_ids)} tokens) disagree with "
            f"output_token_logprobs ({len(ids)} tokens)"
        )

    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    if kind == "abort" and isinstance(finish, dict):
        status = finish.get("status_code")
        # An abort with an error status is the engine refusing the request (a prompt over the
        # context length, say), not a cancel: the harness should see the engine's message.
        if isinstance(status, int) and status >= 400:
            raise EngineError(f"sglang: {finish.get('message') or 'request aborted'}", status)
        logger.debug("sglang: request %s aborted: %s", req.request_id, finish.get("message"))
    if kind not in ("stop", "length", "abort"):
        raise EngineError(f"sglang answer has an unknown finish_reason {finish!r}")

    prompt_tokens = meta.get("prompt_tokens")
    if not isinstance(prompt_tokens, int):
        prompt_tokens = len(req.input_ids)
    elif prompt_tokens != len(req.input_ids):
        logger.warning(
            "sglang counted %d prompt tokens for request %s, tokentrail sent %d",
            prompt_tokens,
            req.request_id,
            len(req.input_ids),
        )
    return Generation(
        ids,
        logprobs,
        kind,
        prompt_tokens,
        elapsed,
        routed_experts=_routed_experts(meta, req, prompt_tokens, len(ids), lifted),
        indexer_topk=_indexer_topk(meta, req, prompt_tokens, len(ids), lifted),
        weight_versions=weight_spans(
            meta.get("weight_version"), meta.get("weight_versions"), len(ids), req.request_id
        ),
    )


def _int32_rows(
    meta: dict[str, Any],
    key: str,
    req: GenerateRequest,
    dtype: np.dtype,
    lifted: Mapping[str, Base64],
) -> np.ndarray | ReplayRows:
    """`meta_info[key]` decoded into `dtype` (the store's): standard base64 of raw
    little-endian int32, no header."""
    raw = meta.get(key)
    if isinstance(raw, str):
        raw = lifted.get(raw, raw)
    if not isinstance(raw, str | memoryview):
        flag = "--enable-return-" + key.replace("_", "-")
        logger.warning(
            "sglang returned no %s for request %s (a server without %s, or an abort)",
            key,
            req.request_id,
            flag,
        )
        return ReplayRows.missing(ReplayGap.ENGINE_RETURNED_NONE)
    values = decode_int32_base64(raw, dtype)
    if isinstance(values, str):
        logger.warning("sglang %s of request %s: %s", key, req.request_id, values)
        return ReplayRows.missing(ReplayGap.SHAPE_MISMATCH)
    return values


def _routed_experts(
    meta: dict[str, Any],
    req: GenerateRequest,
    prompt: int,
    output: int,
    lifted: Mapping[str, Base64],
) -> ReplayRows | None:
    replay = req.replay
    if replay.routed_start is None or replay.routing is None:
        return None
    values = _int32_rows(meta, "routed_experts", req, replay.routing.dtype, lifted)
    if isinstance(values, ReplayRows):
        return values
    start = min(replay.routed_start, prompt)
    row = replay.routing.layers * replay.routing.top_k
    if start and values.size == (prompt + output - 1) * row:
        # SGLang 0.5.9 to 0.5.11 accept `routed_experts_start_len` but return every position.
        logger.debug("sglang ignored routed_experts_start_len=%d; slicing", start)
        values = values[start * row :]
    details = meta.get("cached_tokens_details")
    if isinstance(details, dict) and (details.get("host") or details.get("storage")):
        # HiCache restores KV without the routing rows written with it (sgl-project/sglang
        # #26975, #39027): the cached prefix's rows may be stale.
        logger.warning(
            "sglang served request %s's prefix from HiCache (%s): its routed experts may be stale",
            req.request_id,
            details,
        )
    return checked_rows(
        Replay.ROUTED_EXPERTS,
        values,
        start=start,
        prompt_tokens=prompt,
        output_tokens=output,
        shape=replay.routing,
        request_id=req.request_id,
    )


def _indexer_topk(
    meta: dict[str, Any],
    req: GenerateRequest,
    prompt: int,
    output: int,
    lifted: Mapping[str, Base64],
) -> ReplayRows | None:
    shape = req.replay.indexer
    if shape is None:
        return None
    values = _int32_rows(meta, "indexer_topk", req, np.dtype(np.int32), lifted)
    if isinstance(values, ReplayRows):
        return values
    layers = meta.get("indexer_topk_num_layers", shape.layers)  # sglang-miles reports it
    if layers != shape.layers:
        logger.warning(
            "sglang reports %s indexer layers for request %s, the model has %d",
            layers,
            req.request_id,
            shape.layers,
        )
        return ReplayRows.missing(ReplayGap.SHAPE_MISMATCH)
    return checked_rows(
        Replay.INDEXER_TOPK,
        values,
        start=0,
        prompt_tokens=prompt,
        output_tokens=output,
        shape=shape,
        request_id=req.request_id,
    )


@register_engine("sglang", "sglang://HOST:PORT")
def _from_spec(spec: str, address: str, tokenizer: LoadedTokenizer, timeout: float) -> SGLangEngine:
    return SGLangEngine(base_url(spec, address), tokenizer, timeout=timeout)
