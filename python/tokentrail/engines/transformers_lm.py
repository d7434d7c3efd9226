"""A Hugging Face causal LM run in this process on CPU, behind the engine interface.

`--engine transformers:DIR` samples from the model in DIR (temperature, top-p, top-k, seed);
`transformers:DIR+SPEC` teacher-forces the replies of another engine (`scripted:FILE`,
`simulated`): the tokens are that engine's, the logprobs and the routing the model's. DIR may
be `tiny:NAME`, a tiny model of `tokentrail.model.tiny`, built on first use.

Like SGLang's radix cache, each session keeps the KV cache of what it fed forward (prompt and
output but the last sampled token), up to four branches of it, so a turn computes only the
positions its prompt adds. A MoE answers `routed_experts` the way SGLang does: one row per
position from the start asked for, each as computed when that position was first fed (held with
the cache), the last token never fed. Logprobs are those of the model's distribution at the
request's temperature, before top-p/top-k, as SGLang reports them.

A vision-language model (`tiny:qwen2.5-vl`, `tiny:qwen3-vl`) takes the request's images, each
on its run of image tokens (`model.vision`); a branch's cache is reused only up to the first
image that is not the one it was computed with (two images of one size have the same tokens).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokentrail.core.routing import RoutingShape, weight_spans
from tokentrail.engines.base import (
    Engine,
    GenerateRequest,
    Generation,
    ReplayRequest,
    SamplingParams,
    routed_from_zero,
    token_list,
)
from tokentrail.engines.registry import create_engine, register_engine
from tokentrail.errors import EngineError, EngineSpecError, ModelError
from tokentrail.messages import ImageInput
from tokentrail.model.forward import CausalLM, crop
from tokentrail.model.vision import image_runs
from tokentrail.text.tokenizer import LoadedTokenizer

logger = logging.getLogger(__name__)

MAX_BRANCHES = 4
MAX_SESSIONS = 64
TINY_PREFIX = "tiny:"
# Stop strings are looked for in the text of this many last output tokens.
STOP_WINDOW = 64


@dataclass
class _Branch:
    """What one line of a session fed forward: its tokens, their KV cache and routed experts."""

    tokens: list[int]
    cache: Any
    rows: np.ndarray | None
    # The images of `tokens`, in token order.
    images: list[ImageInput] = dataclasses.field(default_factory=list)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    left, right = 0, n  # a[:left] == b[:left], a[:right] != b[:right]
    while right - left > 1:
        mid = (left + right) // 2
        if a[:mid] == b[:mid]:
            left = mid
        else:
            right = mid
    return left


class TransformersEngine:
    """The model in `path` answering turns in process; see the module docstring.

    `inner`, when given, chooses every reply's tokens (teacher forcing); without it the model
    samples them.
    """

    name = "transformers"

    def __init__(
        self,
        path: str | Path,
        tokenizer: LoadedTokenizer,
        *,
        inner: Engine | None = None,
        threads: int | None = None,
        prefix_reuse: bool = True,
    ) -> None:
        self.lm = CausalLM(path, threads=threads)
        # Off: every turn computes its whole prompt again (the slow path reuse must equal).
        self.prefix_reuse = prefix_reuse
        self.tokenizer = tokenizer
        if tokenizer.vocab_size > self.lm.vocab_size:
            raise ModelError(
                f"the tokenizer has {tokenizer.vocab_size} ids but the model at {path} only "
                f"{self.lm.vocab_size}: they do not belong together"
            )
        self.inner = inner
        self.supports_constraints = inner.supports_constraints if inner is not None else False
        # A text model's prompts carry no images: pixels would have nowhere to go.
        self.supports_images = self.lm.vision is not None
        self.weight_version = Path(path).name
        self._sessions: OrderedDict[str, list[_Branch]] = OrderedDict()
        self._aborted: set[str] = set()
        # Positions computed and positions served from the cache, over all requests.
        self.computed_positions = 0
        self.cached_positions = 0

    @property
    def routing(self) -> RoutingShape | None:
        """The model's routing shape (None for a dense model)."""
        return self.lm.routing

    async def generate(self, req: GenerateRequest) -> Generation:
        start = time.perf_counter()
        forced = None
        if self.inner is not None:
            forced = await self.inner.generate(dataclasses.replace(req, replay=ReplayRequest()))
        try:
            output, logprobs, finish, fed_rows = await asyncio.to_thread(self._run, req, forced)
        except ModelError as exc:
            raise EngineError(f"{self.name}: {exc}") from None
        finally:
            self._aborted.discard(req.request_id)
        prompt = len(req.input_ids)
        routed = routed_from_zero(req, fed_rows, prompt, len(output))
        return Generation(
            output,
            logprobs,
            finish,
            prompt,
            time.perf_counter() - start,
            routed_experts=routed,
            indexer_topk=req.replay.unsupported()[1],
            weight_versions=weight_spans(self.weight_version, None, len(output)),
        )

    def _run(
        self, req: GenerateRequest, forced: Generation | None
    ) -> tuple[list[int], list[float], str, np.ndarray | None]:
        prompt = token_list(req.input_ids)
        if not prompt:
            raise ModelError("an empty prompt")
        images = list(req.images)
        if self.lm.vision is not None:
            self.lm.vision.check(prompt, images)
        elif images:
            raise ModelError(f"{self.lm.path} is a text model: it takes no images")
        with self.lm.lock:
            branch, keep = self._branch(req.session_id, prompt, images)
            self.cached_positions += keep
            temperature = req.sampling.temperature
            if forced is not None:
                output = list(forced.output_ids)
                if not output:
                    raise ModelError(f"{type(self.inner).__name__} chose no tokens to force")
                fed = prompt + output[:-1]
                hidden, rows = self.lm.forward(
                    fed[keep:], branch.cache, images=images, context=self._context(fed, keep)
                )
                first = len(prompt) - 1 - keep
                logprobs = self.lm.logprobs(
                    hidden[first : first + len(output)], output, temperature
                ).tolist()
                finish = forced.finish_reason
                new_rows = rows
            else:
                output, logprobs, finish, new_rows = self._sample(req, prompt, keep, branch)
                fed = prompt + output[:-1]
            self.computed_positions += len(fed) - keep
            branch.tokens = fed
            branch.images = images
            if new_rows is not None:
                held = branch.rows[:keep] if branch.rows is not None else new_rows[:0]
                branch.rows = np.concatenate([held, new_rows])
            return output, logprobs, finish, branch.rows

    def _sample(
        self, req: GenerateRequest, prompt: list[int], keep: int, branch: _Branch
    ) -> tuple[list[int], list[float], str, np.ndarray | None]:
        import torch

        params = req.sampling
        seed = params.seed
        if seed is None:
            seed = int.from_bytes(
                hashlib.blake2b(req.request_id.encode(), digest_size=8).digest(), "big"
            )
        generator = torch.Generator().manual_seed(seed % 2**63)
        images = req.images
        hidden, rows = self.lm.forward(
            prompt[keep:], branch.cache, images=images, context=self._context(prompt, keep)
        )
        parts = [] if rows is None else [rows]
        last = hidden[-1:]
        output: list[int] = []
        logprobs: list[float] = []
        ends = self.tokenizer.end_token_ids
        while True:
            token, logprob = sample_token(self.lm.logits(last)[0], params, generator)
            output.append(token)
            logprobs.append(logprob)
            if token in ends:
                return output, logprobs, "stop", _joined(parts)
            if len(output) >= params.max_new_tokens:
                return output, logprobs, "length", _joined(parts)
            if params.stop and _hits_stop(self.tokenizer, output, params.stop):
                return output, logprobs, "stop", _joined(parts)
            if req.request_id in self._aborted:
                return output, logprobs, "abort", _joined(parts)
            fed = [*prompt, *output[:-1]] if self.lm.vision is not None else []
            last, rows = self.lm.forward([token], branch.cache, images=images, context=fed)
            if rows is not None:
                parts.append(rows)

    def _context(self, tokens: list[int], keep: int) -> list[int]:
        """What a vision model reads of the cached tokens (a text model reads nothing)."""
        return tokens[:keep] if self.lm.vision is not None else []

    def _shared(self, branch: _Branch, prompt: list[int], images: list[ImageInput]) -> int:
        """The positions `prompt` (with `images`) shares with `branch`: its common prefix, cut
        back to the start of the first image whose bytes are not the branch's."""
        shared = common_prefix(branch.tokens, prompt)
        if self.lm.vision is None or not (images or branch.images):
            return shared
        runs = image_runs(np.asarray(prompt[:shared]), self.lm.vision.pad_id)
        for k, (at, _) in enumerate(runs):
            if k >= len(branch.images) or branch.images[k].data != images[k].data:
                return at
        return shared

    def _branch(
        self, session_id: str, prompt: list[int], images: list[ImageInput]
    ) -> tuple[_Branch, int]:
        """The session's branch sharing the longest prefix with `prompt`, its cache cut back to
        what `prompt` reuses, and how many positions it keeps (at least the last prompt token
        is fed again, for the logits of the first output token)."""
        if not self.prefix_reuse:
            return _Branch([], self.lm.new_cache(), None), 0
        branches = self._sessions.pop(session_id, None) or []
        self._sessions[session_id] = branches
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        best, shared = None, 0
        for branch in branches:
            n = self._shared(branch, prompt, images)
            if best is None or n > shared:
                best, shared = branch, n
        keep = min(shared, len(prompt) - 1)
        if best is None or keep == 0:
            best = _Branch([], self.lm.new_cache(), None)
            keep = 0
            branches.append(best)
        elif keep < len(best.tokens):
            if len(branches) < MAX_BRANCHES:
                # A new line of the session (a retry, a sub-agent, an edited history): keep the
                # old one for the requests that continue it.
                best = _Branch(
                    list(best.tokens), copy.deepcopy(best.cache), best.rows, list(best.images)
                )
                branches.append(best)
            crop(best.cache, keep)
            best.tokens = best.tokens[:keep]
        branches.remove(best)
        branches.append(best)
        while len(branches) > MAX_BRANCHES:
            branches.pop(0)
        return best, keep

    async def abort(self, request_id: str) -> None:
        """Stop a sampling loop after its current token."""
        self._aborted.add(request_id)

    async def close(self) -> None:
        self._sessions.clear()
        if self.inner is not None:
            await self.inner.close()


def sample_token(logits: Any, params: SamplingParams, generator: Any) -> tuple[int, float]:
    """One token from float32 `logits` `[vocab]` under `params`, and its logprob at the
    temperature before top-k/top-p (greedy at temperature 0: the unscaled logprob)."""
    import torch

    temperature = params.temperature
    if temperature <= 0:
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, dim=-1)[token])
    logp = torch.log_softmax(logits / temperature, dim=-1)
    probs = logp.exp()
    if 0 < params.top_k < probs.numel():
        cut = torch.topk(probs, params.top_k).values[-1]
        probs = torch.where(probs >= cut, probs, torch.zeros_like(probs))
    if params.top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        before = torch.cumsum(ordered, dim=0) - ordered
        ordered = torch.where(before < params.top_p * ordered.sum(), ordered, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, ordered)
    token = int(torch.multinomial(probs / probs.sum(), 1, generator=generator))
    return token, float(logp[token])


def _hits_stop(tokenizer: LoadedTokenizer, output: list[int], stops: list[str]) -> bool:
    text = tokenizer.decode(output[-STOP_WINDOW:])
    return any(s and s in text for s in stops)


def _joined(parts: list[np.ndarray]) -> np.ndarray | None:
    return np.concatenate(parts) if parts else None


def model_dir(spec: str) -> Path:
    """The directory a spec's model part names: a directory, or `tiny:NAME` (built on first
    use)."""
    if spec.startswith(TINY_PREFIX):
        from tokentrail.model.tiny import tiny_model

        return tiny_model(spec.removeprefix(TINY_PREFIX))
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise EngineSpecError(f"transformers:{spec}: {path} is not a model directory")
    return path


@register_engine("transformers", "transformers:DIR[+ENGINE] (DIR or tiny:NAME)")
def _from_spec(
    spec: str, address: str, tokenizer: LoadedTokenizer, timeout: float
) -> TransformersEngine:
    if not address:
        raise EngineSpecError("transformers:DIR needs a model directory (or tiny:NAME)")
    where, plus, inner_spec = address.partition("+")
    inner = create_engine(inner_spec, tokenizer, timeout=timeout) if plus else None
    try:
        return TransformersEngine(model_dir(where), tokenizer, inner=inner)
    except ModelError as exc:
        raise EngineSpecError(f"{spec}: {exc}") from None
