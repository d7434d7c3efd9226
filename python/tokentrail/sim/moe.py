"""A simulated MoE engine's routing, as SGLang records and returns it.

`KVRouting` keeps the routed experts of every position an engine has fed forward, keyed by the
prefix that ends there (as KV slots in a radix cache): a cache hit returns the rows stored when
that prefix was first computed, anything else is computed now, from the computing request, so
rows from different requests differ and a wrong origin shows. `MoEEngine` wraps any engine
(the simulated model, say) and answers `return_routed_experts` with it the way SGLang does:
rows from the start asked for, the last sampled token never fed forward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from tokentrail.core.routing import RoutingShape, checked_rows, weight_spans
from tokentrail.engines.base import Engine, GenerateRequest, Generation, ReplayRequest
from tokentrail.engines.registry import register_engine
from tokentrail.kinds import Replay
from tokentrail.text.tokenizer import LoadedTokenizer

_MASK = 2**64 - 1


class KVRouting:
    """Every position an engine fed forward, with the routed experts computed for it.

    `dense_layers` first layers are dense (DeepSeek's `first_k_dense_replace`): SGLang keeps
    their slot and leaves it zeros. Rows are held in the store's compact type.
    """

    def __init__(self, shape: RoutingShape, *, dense_layers: int = 0) -> None:
        self.shape = shape
        self.dense_layers = dense_layers
        self._slots: dict[int, int] = {}  # prefix hash -> row
        self._rows = np.zeros((0, shape.layers, shape.top_k), dtype=shape.dtype)
        self._used = 0
        # Per computed row, the tag of the request that computed it.
        self.computed_by: list[int] = []

    def __len__(self) -> int:
        return self._used

    def flush(self) -> None:
        """Forget every stored row, as `POST /flush_cache` (or a weight update) does."""
        self._slots.clear()

    def forward(self, tokens: Sequence[int], tag: int) -> tuple[np.ndarray, int]:
        """The rows of `tokens` fed forward in one request, and how many leading positions were
        cached: those come back as stored, the rest are computed from `tag` and stored."""
        keys = self._keys(tokens)
        cached = 0
        while cached < len(keys) and keys[cached] in self._slots:
            cached += 1
        slots = [self._slots[key] for key in keys[:cached]]
        fresh = self._compute(np.arange(cached, len(tokens)), tag)
        first = self._append(fresh)
        for i in range(cached, len(tokens)):
            self._slots[keys[i]] = first + i - cached
            slots.append(first + i - cached)
        self.computed_by += [tag] * len(fresh)
        return self._rows[np.asarray(slots, dtype=np.int64)].astype(np.int32), cached

    def rows_of(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """What the engine holds for each prefix of `tokens`: rows and the tag that computed
        each (-1 where nothing is held); nothing is computed."""
        rows = np.zeros((len(tokens), self.shape.layers, self.shape.top_k), dtype=np.int32)
        tags = np.full(len(tokens), -1, dtype=np.int64)
        for i, key in enumerate(self._keys(tokens)):
            slot = self._slots.get(key)
            if slot is None:
                break
            rows[i], tags[i] = self._rows[slot], self.computed_by[slot]
        return rows, tags

    @staticmethod
    def _keys(tokens: Sequence[int]) -> list[int]:
        """Each position's key: a 64-bit FNV-1a chain over the prefix that ends there."""
        keys, h = [], 0xCBF29CE484222325
        for tok in tokens:
            h = ((h ^ (int(tok) + 1)) * 0x100000001B3) & _MASK
            keys.append(h)
        return keys

    def serve(
        self, input_ids: Sequence[int], output_ids: Sequence[int], start: int, tag: int
    ) -> tuple[np.ndarray, int]:
        """SGLang's `routed_experts` for one request: rows of positions `start..` of prompt +
        output but the last token (`start` clamped as SGLang clamps it), and the cached count."""
        fed = [*input_ids, *output_ids][: max(0, len(input_ids) + len(output_ids) - 1)]
        rows, cached = self.forward(fed, tag)
        return rows[min(start, len(fed)) :], cached

    def _compute(self, positions: np.ndarray, tag: int) -> np.ndarray:
        """Distinct experts per (position, layer), a function of the computing request."""
        layers, k, experts = self.shape.dims
        base = (
            positions[:, None] * 2654435761 + np.arange(layers)[None, :] * 40503 + tag * 97531
        ) % experts
        rows = (base[:, :, None] + np.arange(k)[None, None, :]) % experts
        rows[:, : self.dense_layers] = 0
        return rows.astype(self.shape.dtype)

    def _append(self, rows: np.ndarray) -> int:
        first = self._used
        need = first + len(rows)
        if need > len(self._rows):
            grown = np.zeros((max(need, 2 * len(self._rows)),) + rows.shape[1:], self._rows.dtype)
            grown[:first] = self._rows[:first]
            self._rows = grown
        self._rows[first:need] = rows
        self._used = need
        return first


class MoEEngine:
    """Any engine, answering for routed experts as an SGLang MoE server would.

    The routing shape is the one each request asks to be checked against; the weight version
    is `weight_version` (change it between turns to simulate an in-flight weight update).
    """

    name = "simulated-moe"
    # Requests reach the inner engine without their constraint checked here: none is taken.
    supports_constraints = False
    supports_images = False

    def __init__(self, inner: Engine, *, weight_version: str = "sim-0") -> None:
        self.inner = inner
        self.weight_version = weight_version
        self.kv: KVRouting | None = None
        self.requests = 0

    async def generate(self, req: GenerateRequest) -> Generation:
        replay = req.replay
        inner = await self.inner.generate(dataclasses.replace(req, replay=ReplayRequest()))
        self.requests += 1
        routed = None
        prompt, output = list(req.input_ids), inner.output_ids
        if replay.routed_start is not None and replay.routing is not None:
            if self.kv is None or self.kv.shape != replay.routing:
                self.kv = KVRouting(replay.routing)
            start = min(replay.routed_start, len(prompt))
            rows, _ = self.kv.serve(prompt, output, start, self.requests)
            routed = checked_rows(
                Replay.ROUTED_EXPERTS,
                rows,
                start=start,
                prompt_tokens=len(prompt),
                output_tokens=len(output),
                shape=replay.routing,
                request_id=req.request_id,
            )
        return dataclasses.replace(
            inner,
            routed_experts=routed,
            indexer_topk=replay.unsupported()[1],
            weight_versions=weight_spans(self.weight_version, None, len(output)),
        )

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    async def close(self) -> None:
        await self.inner.close()


@register_engine("simulated-moe", "simulated-moe")
def _from_spec(spec: str, address: str, tokenizer: LoadedTokenizer, timeout: float) -> MoEEngine:
    from tokentrail.sim.model import SimulatedEngine

    return MoEEngine(SimulatedEngine(tokenizer))
