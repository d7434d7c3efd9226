"""Routing replay: what an engine reports per token beyond ids and logprobs, and the checks it
must pass, so training computes the function sampling did.

MoE routed experts and sparse-attention indexer top-k come back as rows `[tokens, layers, k]`
for a stretch of a turn's prompt + output: `ReplayRows` is one turn's rows, or why it has none.
`RoutingShape` and `IndexerShape` are the model's shapes those rows must fit, read from its
`config.json` (or given). `WeightSpan`s say which weights sampled which output tokens.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt

from tokentrail.core.ids import RowArray
from tokentrail.errors import ReplayError
from tokentrail.kinds import Replay, ReplayGap, parse_kind

logger = logging.getLogger(__name__)

# Rows checked for repeated experts at a time.
_CHECK_ROWS = 4096

# The keys HF configs name a MoE's routed expert count and router top-k by.
_EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k")


@dataclass(frozen=True)
class RoutingShape:
    """A MoE's routing as SGLang reports it: every decoder layer a slot (dense ones zeros),
    `top_k` logical expert ids in `[0, num_experts)` per layer."""

    layers: int
    top_k: int
    num_experts: int

    def __post_init__(self) -> None:
        if not all(isinstance(d, int) and 1 <= d < 2**32 for d in self.dims):
            raise ReplayError(
                "routed_experts: layers, top_k and num_experts must lie in [1, 2**32), got "
                f"{self.dims}"
            )

    @property
    def dims(self) -> tuple[int, int, int]:
        """`(layers, top_k, num_experts)`, as `TurnStore(routed_experts=...)` takes it."""
        return self.layers, self.top_k, self.num_experts

    @property
    def dtype(self) -> np.dtype:
        """The smallest integer type that holds every expert id: what the store keeps."""
        for dtype in (np.uint8, np.uint16):
            if self.num_experts - 1 <= np.iinfo(dtype).max:
                return np.dtype(dtype)
        return np.dtype(np.uint32)

    @property
    def row_bytes(self) -> int:
        """Bytes one token's routing takes in the store."""
        return self.layers * self.top_k * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.layers},{self.top_k},{self.num_experts}"

    @classmethod
    def parse(cls, text: str) -> RoutingShape:
        """`"LAYERS,TOP_K,NUM_EXPERTS"`, as `--routing-shape` takes it."""
        return cls(*_ints(text, 3, "routing shape", "LAYERS,TOP_K,NUM_EXPERTS"))


@dataclass(frozen=True)
class IndexerShape:
    """A sparse-attention indexer's top-k: `top_k` int32 indices per indexer layer, -1 for an
    empty slot."""

    layers: int
    top_k: int

    def __post_init__(self) -> None:
        if not all(isinstance(d, int) and d >= 1 for d in self.dims):
            raise ReplayError(f"indexer_topk: layers and top_k must be >= 1, got {self.dims}")

    @property
    def dims(self) -> tuple[int, int]:
        return self.layers, self.top_k

    @property
    def row_bytes(self) -> int:
        return 4 * self.layers * self.top_k

    def __str__(self) -> str:
        return f"{self.layers},{self.top_k}"

    @classmethod
    def parse(cls, text: str) -> IndexerShape:
        """`"LAYERS,TOP_K"`, as `--indexer-shape` takes it."""
        return cls(*_ints(text, 2, "indexer shape", "LAYERS,TOP_K"))


def _ints(text: str, n: int, what: str, form: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if len(values) != n:
        raise ReplayError(f"{what} {text!r} is not {form}")
    return values


@dataclass(frozen=True)
class ReplayRows:
    """One turn's rows on one channel: `rows[i]` is position `start + i` of prompt + output,
    up to but not including the last token (never fed forward); or `gap`, why there are none."""

    rows: RowArray | None = None
    start: int = 0
    gap: ReplayGap | None = None

    @classmethod
    def missing(cls, gap: ReplayGap) -> ReplayRows:
        return cls(None, 0, parse_kind(ReplayGap, gap, "replay gap", ReplayError))

    def store_arg(self) -> str | tuple[int, RowArray]:
        """What `TurnStore.push` takes for it."""
        if self.rows is None:
            return str(self.gap or ReplayGap.ENGINE_RETURNED_NONE)
        return self.start, self.rows


def checked_rows(
    channel: Replay,
    values: npt.NDArray[np.integer],
    *,
    start: int,
    prompt_tokens: int,
    output_tokens: int,
    shape: RoutingShape | IndexerShape,
    request_id: str = "",
) -> ReplayRows:
    """An engine's rows for positions `start..` of a turn, if they fit the model: `values` is
    the flat buffer (SGLang) or `[rows, layers, k]` (vLLM). A misfit is logged and becomes a
    `SHAPE_MISMATCH`, never an error: the turn itself is fine, its replay data is not."""
    expected = max(0, prompt_tokens + output_tokens - 1 - start)
    layers, width = shape.dims[:2]
    problem = None
    if values.size != expected * layers * width or values.ndim not in (1, 3):
        problem = f"{values.size} values, not {expected} rows x {layers} layers x {width}"
    elif values.ndim == 3 and values.shape[1:] != (layers, width):
        problem = f"rows of {values.shape[1:]}, not ({layers}, {width})"
    else:
        rows = values.reshape(expected, layers, width)
        problem = _out_of_range(channel, rows, shape)
    if problem is not None:
        logger.warning(
            "%s of request %s do not fit the model (%s): the turn has no %s",
            channel,
            request_id,
            problem,
            channel,
        )
        return ReplayRows.missing(ReplayGap.SHAPE_MISMATCH)
    return ReplayRows(rows, start)


def _out_of_range(
    channel: Replay, rows: RowArray, shape: RoutingShape | IndexerShape
) -> str | None:
    if isinstance(shape, IndexerShape):
        low = int(rows.min()) if rows.size else 0
        return None if low >= -1 else f"index {low} below -1"
    if rows.size == 0:
        return None
    low, high = int(rows.min()), int(rows.max())
    if low < 0 or high >= shape.num_experts:
        return f"expert ids in [{low}, {high}], not in [0, {shape.num_experts})"
    # A layer's top-k is k distinct experts; a dense layer is all zeros. Checked a block of
    # rows at a time: the sorted copy of a 128K-token turn would be as big as the turn.
    for begin in range(0, len(rows), _CHECK_ROWS):
        block = rows[begin : begin + _CHECK_ROWS]
        ordered = np.sort(block, axis=-1)
        repeats = (np.diff(ordered, axis=-1) == 0).any(axis=-1)
        dense = (block == 0).all(axis=-1)
        if (repeats & ~dense).any():
            return "a layer routes a token to one expert twice"
    return None


class WeightSpanJson(TypedDict):
    version: str
    start: int
    end: int


@dataclass(frozen=True)
class WeightSpan:
    """Output tokens `start..end` of a turn were sampled with weights `version`."""

    version: str
    start: int
    end: int

    def to_dict(self) -> WeightSpanJson:
        return {"version": self.version, "start": self.start, "end": self.end}


def weight_spans(
    version: object, spans: object, outputs: int, request_id: str = ""
) -> tuple[WeightSpan, ...]:
    """A turn's weight versions over its `outputs` tokens: the engine's spans when they tile
    the output (SGLang >= 0.5.20, vLLM's `return_weight_versions`), else one span of
    `version`; none when the engine names no version."""
    if isinstance(spans, list) and spans:
        try:
            tiled = tuple(
                WeightSpan(str(s["version"]), int(s["start"]), int(s["end"])) for s in spans
            )
        except (KeyError, TypeError, ValueError):
            tiled = ()
        edges = [0, *(e for s in tiled for e in (s.start, s.end)), outputs]
        if tiled and all(a == b for a, b in zip(edges[::2], edges[1::2], strict=True)):
            return tiled
        logger.debug("request %s: weight_versions %r do not tile the output", request_id, spans)
    if isinstance(version, str) and version:
        return (WeightSpan(version, 0, outputs),)
    return ()


# -- the model's shapes -------------------------------------------------------------------------


def read_model_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A model's HF `config.json`: the file, or the one in a model directory."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReplayError(f"cannot read the model config {path}: {exc}") from None
    if not isinstance(config, dict):
        raise ReplayError(f"model config {path} is not a JSON object")
    return config


def model_shapes(config: Mapping[str, Any]) -> tuple[RoutingShape | None, IndexerShape | None]:
    """The routing and indexer shapes SGLang reports for a model, from its HF config (a VL
    model's `text_config`): `num_hidden_layers` slots, `num_experts_per_tok` of the routed
    experts; `index_topk` per indexer layer. None where the model has no such thing."""
    text = config.get("text_config")
    cfg: Mapping[str, Any] = {**config, **text} if isinstance(text, Mapping) else config
    layers = _first(cfg, ("num_hidden_layers", "num_layers", "n_layer"))
    top_k, experts = _first(cfg, _TOP_K_KEYS), _first(cfg, _EXPERT_KEYS)
    routing = None
    if layers and top_k and experts:
        routing = RoutingShape(layers, top_k, experts)
    indexer = None
    index_topk = _first(cfg, ("index_topk",))
    if index_topk:
        ratios = cfg.get("compress_ratios")
        if isinstance(ratios, list):
            indexer_layers = sum(1 for r in ratios if r == 4)
        else:
            indexer_layers = _first(cfg, ("num_indexer_layers",)) or layers or 0
        if indexer_layers:
            indexer = IndexerShape(indexer_layers, index_topk)
    return routing, indexer


def _first(cfg: Mapping[str, Any], keys: Sequence[str]) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
