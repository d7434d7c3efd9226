"""The reference of loss masks and linearization (`rust/builder.rs`, `rust/linearize.rs`):
`SampleBuilder` accumulates a run of turns, `linearize` turns chains of turns into samples."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tokentrail.core.ids import LogprobArray, MaskArray, TokenArray, as_token_array
from tokentrail.errors import LogprobLengthError, PolicyError
from tokentrail.kinds import DriftKind, DriftPolicy, parse_kind

CLEAN = DriftKind.CLEAN.value
REALIGN = DriftKind.REALIGN.value
FORK = DriftKind.FORK.value

POLICIES = tuple(p.value for p in DriftPolicy)


def token_list(ids: object, what: str = "token ids") -> list[int]:
    """Validate a token sequence (list, tuple or integer numpy array) into a list of ints."""
    out: list[int] = as_token_array(ids, what).tolist()
    return out


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
        at = lcp(self._tokens, prompt)
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
        lps = logprob_list(logprobs, len(output))
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
    def tokens(self) -> TokenArray:
        return np.asarray(self._tokens, dtype=np.uint32)

    @property
    def loss_mask(self) -> MaskArray:
        return np.asarray(self._mask, dtype=np.uint8)

    @property
    def logprobs(self) -> LogprobArray:
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
            spans=[Span(s.turn, min(s.start, keep), min(s.end, keep)) for s in self.spans],
            trained=trained,
            realigned=dict(self.realigned),
            truncated_tokens=truncated,
        )


@dataclass
class BuiltSample:
    """One linearized run: `tokens` in full, `loss_mask`/`logprobs` over the response part."""

    tokens: TokenArray
    loss_mask: MaskArray
    logprobs: LogprobArray
    response_start: int
    truncated: bool
    turns: list[int]
    # Each turn's output in `tokens` coordinates, cut at the sample's end.
    spans: list[Span] = field(default_factory=list)
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


def _check_settings(policy: str, fork_threshold: int) -> None:
    parse_kind(DriftPolicy, policy, "drift policy", PolicyError)
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
    return prompt, output, logprob_list(logprobs, len(output))


def lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def logprob_list(logprobs: Sequence[float] | None, n: int) -> list[float] | None:
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
