"""Pure-Python reference of tokentrail's hot path.

Same functions, same names and same semantics as the Rust core (`tokentrail._core`); the
differential tests hold the two together and the benchmarks measure one against the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tokentrail.core.ids import as_token_array
from tokentrail.errors import LogprobLengthError, PackError, PolicyError
from tokentrail.kinds import DriftKind, DriftPolicy

CLEAN = DriftKind.CLEAN.value
REALIGN = DriftKind.REALIGN.value
FORK = DriftKind.FORK.value

POLICIES = tuple(p.value for p in DriftPolicy)


def token_list(ids: object, what: str = "token ids") -> list[int]:
    """Validate a token sequence (list, tuple or integer numpy array) into a list of ints."""
    return as_token_array(ids, what).tolist()


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    a, b = token_list(a, "a"), token_list(b, "b")
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class Drift:
    """How an incoming prompt relates to the tokens a builder holds.

    `at` is the divergence point (the common-prefix length); `drifted` is how many held tokens
    the prompt does not reproduce.
    """

    kind: str
    at: int
    drifted: int


@dataclass
class Span:
    """One turn's sampled output inside a builder: tokens [start, end)."""

    turn: int
    start: int
    end: int


class SampleBuilder:
    """Accumulates one coherent run of turns into tokens, loss mask and logprobs.

    The first turn's prompt is context only and is stripped from the sample; each later turn
    appends the part of its prompt the builder does not hold yet (mask 0), then its output
    (mask 1 with the sampled logprobs, or mask 0 when re-emitted as context).
    """

    def __init__(self, policy: str = "minimal", fork_threshold: int = 1024) -> None:
        _check_settings(policy, fork_threshold)
        self.policy = policy
        self.fork_threshold = fork_threshold
        self._tokens: list[int] = []
        self._mask: list[int] = []
        self._logprobs: list[float] = []
        self.spans: list[Span] = []
        self.response_start = 0
        # Per turn: trained tokens removed by realignment.
        self.realigned: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._tokens)

    def classify(self, prompt_ids: Sequence[int], output_len: int = 0) -> Drift:
        prompt = token_list(prompt_ids, "prompt_ids")
        held = len(self._tokens)
        at = _lcp(self._tokens, prompt)
        if at == held:
            return Drift(CLEAN, at, 0)
        drifted = held - at
        last = self.spans[-1] if self.spans else None
        if last is None or last.start == last.end or at < last.start or self.fork_threshold == 0:
            return Drift(FORK, at, drifted)
        gate = output_len if self.policy == "slime" else drifted
        return Drift(REALIGN if gate < self.fork_threshold else FORK, at, drifted)

    def append_turn(
        self,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        *,
        trained: bool = True,
        turn: int = 0,
    ) -> Drift:
        """Append a turn, healing a REALIGN. A FORK is refused: start a new builder."""
        prompt = token_list(prompt_ids, "prompt_ids")
        output = token_list(output_ids, "output_ids")
        lps = _logprob_list(logprobs, len(output))
        drift = self.classify(prompt, len(output))
        if drift.kind == FORK:
            raise PolicyError(
                f"turn {turn} forks from the held tokens at {drift.at}; start a new builder"
            )
        cut = len(self._tokens)
        if drift.kind == REALIGN:
            last = self.spans[-1]
            cut = last.start if self.policy == "slime" else drift.at
            lost = sum(self._mask[cut : last.end])
            if lost:
                self.realigned[last.turn] = self.realigned.get(last.turn, 0) + lost
            last.end = cut
            del self._tokens[cut:], self._mask[cut:], self._logprobs[cut:]
        first = not self.spans
        tail = prompt[cut:]
        self._tokens += tail
        self._mask += [0] * len(tail)
        self._logprobs += [0.0] * len(tail)
        start = len(self._tokens)
        self._tokens += output
        if trained:
            self._mask += [1] * len(output)
            self._logprobs += lps if lps is not None else [0.0] * len(output)
        else:
            self._mask += [0] * len(output)
            self._logprobs += [0.0] * len(output)
        self.spans.append(Span(turn, start, len(self._tokens)))
        if first:
            self.response_start = len(prompt)
        return drift

    def has_trained_response(self) -> bool:
        return any(self._mask[self.response_start :])

    @property
    def tokens(self) -> np.ndarray:
        return np.asarray(self._tokens, dtype=np.uint32)

    @property
    def loss_mask(self) -> np.ndarray:
        return np.asarray(self._mask, dtype=np.uint8)

    @property
    def logprobs(self) -> np.ndarray:
        return np.asarray(self._logprobs, dtype=np.float32)

    def finish(self, max_sample_tokens: int = 0) -> BuiltSample:
        """Cut the sample to `max_sample_tokens` (0: no limit) and return its arrays."""
        _check_limit(max_sample_tokens)
        total = len(self._tokens)
        keep = total if max_sample_tokens == 0 else min(total, max_sample_tokens)
        truncated: dict[int, int] = {}
        trained: dict[int, int] = {}
        for span in self.spans:
            if span.end <= span.start:
                continue
            kept = sum(self._mask[span.start : min(span.end, keep)])
            cut = sum(self._mask[max(span.start, keep) : span.end])
            if kept:
                trained[span.turn] = trained.get(span.turn, 0) + kept
            if cut:
                truncated[span.turn] = truncated.get(span.turn, 0) + cut
        strip = min(self.response_start, keep)
        return BuiltSample(
            tokens=np.asarray(self._tokens[:keep], dtype=np.uint32),
            loss_mask=np.asarray(self._mask[strip:keep], dtype=np.uint8),
            logprobs=np.asarray(self._logprobs[strip:keep], dtype=np.float32),
            response_start=strip,
            truncated=keep < total,
            turns=[s.turn for s in self.spans],
            trained=trained,
            realigned=dict(self.realigned),
            truncated_tokens=truncated,
        )


@dataclass
class BuiltSample:
    """One linearized run: `tokens` in full, `loss_mask`/`logprobs` over the response part."""

    tokens: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    response_start: int
    truncated: bool
    turns: list[int]
    trained: dict[int, int] = field(default_factory=dict)
    realigned: dict[int, int] = field(default_factory=dict)
    truncated_tokens: dict[int, int] = field(default_factory=dict)
    chain: int = 0

    def has_trained_response(self) -> bool:
        return bool(self.loss_mask.any())


@dataclass(frozen=True)
class DriftEvent:
    chain: int
    turn: int
    kind: str
    at: int
    drifted: int


@dataclass
class Linearized:
    """Every sample of a set of chains, with the drift decisions taken on the way.

    `samples` holds only runs with a trained response; `trained`, `realigned` and `truncated`
    count tokens per turn over every run, emitted or not.
    """

    samples: list[BuiltSample]
    drifts: list[DriftEvent]
    trained: dict[int, int]
    realigned: dict[int, int]
    truncated: dict[int, int]


def linearize(
    turns: Sequence[tuple[Sequence[int], Sequence[int], Sequence[float] | None]],
    chains: Sequence[Sequence[int]],
    *,
    policy: str = "minimal",
    fork_threshold: int = 1024,
    max_sample_tokens: int = 0,
) -> Linearized:
    """Linearize chains of turns into samples.

    `turns[i]` is `(prompt_ids, output_ids, logprobs or None)`; each chain lists turn indices
    in order. A turn is trained on the first chain that reaches it and re-emitted as context
    (mask 0) on later ones. A FORK closes the run and starts a new one.

    Everything is checked before any work, in this order: the policy, `fork_threshold`,
    `max_sample_tokens`, every turn in index order (its ids, then its logprobs), whether a
    chain names it or not, and every chain entry.
    """
    _check_settings(policy, fork_threshold)
    _check_limit(max_sample_tokens)
    checked = [_checked_turn(turn) for turn in turns]
    chains = [list(chain) for chain in chains]
    for c, chain in enumerate(chains):
        for t in chain:
            if not 0 <= t < len(checked):
                raise PolicyError(f"chain {c} names turn {t}, but there are {len(checked)} turns")

    claimed: set[int] = set()
    samples: list[BuiltSample] = []
    drifts: list[DriftEvent] = []
    trained: dict[int, int] = {}
    realigned: dict[int, int] = {}
    truncated: dict[int, int] = {}

    def close(builder: SampleBuilder, chain: int) -> None:
        if not builder.spans:
            return
        built = builder.finish(max_sample_tokens)
        built.chain = chain
        _add(realigned, built.realigned)
        _add(truncated, built.truncated_tokens)
        if built.has_trained_response():
            _add(trained, built.trained)
            samples.append(built)

    for c, chain in enumerate(chains):
        builder = SampleBuilder(policy, fork_threshold)
        for t in chain:
            prompt, output, logprobs = checked[t]
            drift = builder.classify(prompt, len(output))
            if builder.spans:
                drifts.append(DriftEvent(c, t, drift.kind, drift.at, drift.drifted))
            if drift.kind == FORK:
                close(builder, c)
                builder = SampleBuilder(policy, fork_threshold)
            builder.append_turn(prompt, output, logprobs, trained=t not in claimed, turn=t)
            claimed.add(t)
        close(builder, c)
    return Linearized(samples, drifts, trained, realigned, truncated)


@dataclass
class Packed:
    """Samples flattened into one varlen-attention batch: see `storage.export.PackedBatch`."""

    tokens: np.ndarray
    cu_seqlens: np.ndarray
    position_ids: np.ndarray
    sample_index: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    rewards: np.ndarray
    advantages: np.ndarray
    max_seqlen: int


_INT32_MAX = 2**31 - 1


def pack(
    tokens: Sequence[Sequence[int] | np.ndarray],
    loss_masks: Sequence[Sequence[int] | np.ndarray],
    logprobs: Sequence[Sequence[float] | np.ndarray],
    response_lengths: Sequence[int] | np.ndarray,
    rewards: Sequence[float] | np.ndarray,
) -> Packed:
    """Pack samples into one batch for variable-length attention.

    Sample `i` is `tokens[i]` (prompt and response); its last `response_lengths[i]` tokens carry
    `loss_masks[i]` and `logprobs[i]`. Per token: the tokens (uint32), `position_ids` restarting
    at 0 in each sample and `sample_index` (int32), the loss mask (uint8) and logprobs (float32),
    both 0 on prompt positions. Per sample: `rewards` and zero `advantages` (float32).
    `cu_seqlens` (int32) is 0 then the running lengths.

    Masks, logprobs, lengths and rewards are read as `np.asarray` reads them, then the tokens
    (as `token_list` checks them). Then, in order: every per-sample input has one entry per
    token array; sample by sample, `0 <= response_length <= len(tokens)` and the mask, then the
    logprobs, have `response_length` entries; the packed length and the sample count fit int32.
    """
    masks = [_array1(mask, np.uint8) for mask in loss_masks]
    lps = [_array1(lp, np.float32) for lp in logprobs]
    lengths = _array1(response_lengths, np.int64)
    reward_array = _array1(rewards, np.float32)
    ids = [_packed_ids(t, f"tokens[{i}]") for i, t in enumerate(tokens)]

    n = len(ids)
    counts = (
        ("loss_masks", len(masks)),
        ("logprobs", len(lps)),
        ("response_lengths", len(lengths)),
        ("rewards", len(reward_array)),
    )
    for what, got in counts:
        if got != n:
            raise PackError(f"{what}: {got} entries for {n} samples")
    for i, (t, mask, lp, length) in enumerate(zip(ids, masks, lps, lengths.tolist(), strict=True)):
        if not 0 <= length <= len(t):
            raise PackError(
                f"sample {i}: response_length {length} is outside [0, {len(t)}], its token count"
            )
        for what, got in (("loss_mask", len(mask)), ("logprobs", len(lp))):
            if got != length:
                raise PackError(f"sample {i}: {got} {what} entries for response_length {length}")
    seqlens = [len(t) for t in ids]
    total = sum(seqlens)
    if total > _INT32_MAX or n > _INT32_MAX:
        raise PackError(f"{n} samples of {total} tokens in all do not fit int32 cu_seqlens")

    mask_parts: list[np.ndarray] = []
    lp_parts: list[np.ndarray] = []
    for t, mask, lp, length in zip(ids, masks, lps, lengths.tolist(), strict=True):
        prompt = len(t) - length
        mask_parts += [np.zeros(prompt, dtype=np.uint8), mask]
        lp_parts += [np.zeros(prompt, dtype=np.float32), lp]
    cu_seqlens = np.zeros(n + 1, dtype=np.int32)
    cu_seqlens[1:] = np.cumsum(seqlens, dtype=np.int64)
    return Packed(
        tokens=_concat(ids, np.uint32),
        cu_seqlens=cu_seqlens,
        position_ids=_concat([np.arange(k, dtype=np.int32) for k in seqlens], np.int32),
        sample_index=_concat(
            [np.full(k, i, dtype=np.int32) for i, k in enumerate(seqlens)], np.int32
        ),
        loss_mask=_concat(mask_parts, np.uint8),
        logprobs=_concat(lp_parts, np.float32),
        rewards=reward_array.copy(),
        advantages=np.zeros(n, dtype=np.float32),
        max_seqlen=max(seqlens, default=0),
    )


def _array1(values: object, dtype: type[np.generic]) -> np.ndarray:
    """`values` as numpy's `asarray` reads them, which must be 1-D."""
    array = np.asarray(values, dtype=dtype)
    if array.ndim != 1:
        raise TypeError(f"expected a 1-D array of {np.dtype(dtype)}, got {array.ndim} dimensions")
    return array


def _packed_ids(ids: object, what: str) -> np.ndarray:
    """A 1-D uint32 array as it is; anything else checked by `token_list`."""
    if isinstance(ids, np.ndarray) and ids.ndim == 1 and ids.dtype == np.uint32:
        return ids
    return np.asarray(token_list(ids, what), dtype=np.uint32)


def _concat(parts: list[np.ndarray], dtype: type[np.generic]) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=dtype)
    return np.concatenate(parts).astype(dtype, copy=False)


def _check_settings(policy: str, fork_threshold: int) -> None:
    if policy not in POLICIES:
        raise PolicyError(f"unknown drift policy {policy!r}; expected one of {POLICIES}")
    if fork_threshold < 0:
        raise PolicyError(f"fork_threshold must be >= 0, got {fork_threshold}")


def _check_limit(max_sample_tokens: int) -> None:
    if max_sample_tokens < 0:
        raise PolicyError(f"max_sample_tokens must be >= 0, got {max_sample_tokens}")


def _checked_turn(
    turn: tuple[Sequence[int], Sequence[int], Sequence[float] | None],
) -> tuple[list[int], list[int], list[float] | None]:
    """A turn's ids and logprobs, checked: `(prompt, output, logprobs or None)`."""
    prompt_ids, output_ids, logprobs = turn
    prompt = token_list(prompt_ids, "prompt_ids")
    output = token_list(output_ids, "output_ids")
    return prompt, output, _logprob_list(logprobs, len(output))


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _logprob_list(logprobs: Sequence[float] | None, n: int) -> list[float] | None:
    if logprobs is None:
        return None
    lps = [float(x) for x in logprobs]
    if not lps:
        return None
    if len(lps) != n:
        raise LogprobLengthError(f"{len(lps)} logprobs for {n} output tokens")
    return lps


def _add(into: dict[int, int], counts: dict[int, int]) -> None:
    for k, v in counts.items():
        into[k] = into.get(k, 0) + v


class TurnStore:
    """Every turn of one session, stored compactly: a prompt is the prefix it shares with its
    parent turn's tokens (prompt + output) plus its own tail, so memory grows with the unique
    tokens of the session, not with turns x context.

    Turn ids are 0, 1, 2, ... in push order.
    """

    def __init__(self) -> None:
        self._parent: list[int] = []
        self._prefix: list[int] = []
        self._tail: list[list[int]] = []
        self._output: list[list[int]] = []
        self._logprobs: list[list[float] | None] = []
        # The last turn materialized: the next push almost always continues it.
        self._cached: tuple[int, list[int]] = (-1, [])

    def __len__(self) -> int:
        return len(self._parent)

    def push(
        self,
        parent: int,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
    ) -> int:
        """Store a turn; `parent` is the turn whose tokens its prompt continues, or -1."""
        prompt = token_list(prompt_ids, "prompt_ids")
        output = token_list(output_ids, "output_ids")
        lps = _logprob_list(logprobs, len(output))
        if not -1 <= parent < len(self):
            raise PolicyError(f"parent turn {parent} does not exist ({len(self)} turns stored)")
        prefix = _lcp(self._tokens(parent), prompt) if parent >= 0 else 0
        self._parent.append(parent)
        self._prefix.append(prefix)
        self._tail.append(prompt[prefix:])
        self._output.append(output)
        self._logprobs.append(lps)
        return len(self) - 1

    def _check(self, turn: int) -> None:
        if not 0 <= turn < len(self):
            raise PolicyError(f"turn {turn} does not exist ({len(self)} turns stored)")

    def prompt_ids(self, turn: int) -> np.ndarray:
        return np.asarray(self._prompt(turn), dtype=np.uint32)

    def _prompt(self, turn: int) -> list[int]:
        self._check(turn)
        return self._tokens(turn)[: len(self._tokens(turn)) - len(self._output[turn])]

    def _build(self, turn: int) -> list[int]:
        """A turn's full tokens, built down its chain of parents without recursion."""
        chain = [turn]
        while self._parent[chain[-1]] >= 0 and self._cached[0] != self._parent[chain[-1]]:
            chain.append(self._parent[chain[-1]])
        top = self._parent[chain[-1]]
        full = list(self._cached[1]) if top >= 0 else []
        for t in reversed(chain):
            full = full[: self._prefix[t]] + self._tail[t] + self._output[t]
        return full

    def tokens(self, turn: int) -> np.ndarray:
        """The turn's prompt then output ids."""
        self._check(turn)
        return np.asarray(self._tokens(turn), dtype=np.uint32)

    def _tokens(self, turn: int) -> list[int]:
        if self._cached[0] == turn:
            return self._cached[1]
        full = self._build(turn)
        self._cached = (turn, full)
        return full

    def output_ids(self, turn: int) -> np.ndarray:
        self._check(turn)
        return np.asarray(self._output[turn], dtype=np.uint32)

    def logprobs(self, turn: int) -> np.ndarray | None:
        self._check(turn)
        lps = self._logprobs[turn]
        return None if lps is None else np.asarray(lps, dtype=np.float32)

    def output_len(self, turn: int) -> int:
        self._check(turn)
        return len(self._output[turn])

    def nbytes(self) -> int:
        """Bytes the stored ids and logprobs take: 4 per id, 4 per logprob."""
        ids = sum(len(t) for t in self._tail) + sum(len(o) for o in self._output)
        lps = sum(len(lp) for lp in self._logprobs if lp is not None)
        return 4 * ids + 4 * lps + 8 * len(self)

    def heap_bytes(self) -> int:
        """Bytes held. The Rust store reports what its buffers have allocated; Python objects
        have no such figure, so this is `nbytes()`."""
        return self.nbytes()

    def linearize(
        self,
        chains: Sequence[Sequence[int]],
        *,
        policy: str = "minimal",
        fork_threshold: int = 1024,
        max_sample_tokens: int = 0,
    ) -> Linearized:
        """`linearize` over the stored turns: chains name turn ids."""
        # Parents come before children, so each full sequence is built from its parent's once.
        full: list[list[int]] = []
        turns = []
        for t in range(len(self)):
            parent, prefix = self._parent[t], self._prefix[t]
            prompt = (full[parent][:prefix] if parent >= 0 else []) + self._tail[t]
            full.append(prompt + self._output[t])
            turns.append((prompt, self._output[t], self._logprobs[t]))
        return linearize(
            turns,
            chains,
            policy=policy,
            fork_threshold=fork_threshold,
            max_sample_tokens=max_sample_tokens,
        )
