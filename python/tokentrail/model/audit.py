"""The recompute audit: do a sample's trained tokens carry what the model computes for them?

`recompute_samples(model_dir, samples)` feeds each sample's tokens through the model in one
forward pass, without any cache, and holds each trained token's rollout logprob to the
recomputed log p(token | the sample's context), and each position's routed experts to the
experts the model's routers choose for it. A sample whose context is not what was sampled
(history re-tokenized, a token altered) or whose routing rows are shifted shows here; a sample
that passes carries, for the trainer, what the model computed. A sample with images
(`Sample.multimodal_inputs`) is fed with them to a vision-language model, so an image that is
not the one sampled (another of the same size: the same tokens) shows too.

Tokens sampled under a structured-output grammar (`Sample.constrained`, a forced tool call)
carry the grammar's renormalized logprobs, not the model's: they are recomputed and reported
on their own (how many, how far), and held to no tolerance.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokentrail.errors import ModelError
from tokentrail.model.forward import CausalLM
from tokentrail.model.vision import image_runs
from tokentrail.trajectory.sample import Sample

# The largest |recomputed - rollout| logprob a float32 CPU rollout may show against a float32
# recompute of the same model: incremental (KV-cached, chunked) and one-pass forwards differ
# in summation order only, a few 1e-6 on the tiny models (docs/audit.md).
DEFAULT_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Position:
    """One trained token whose rollout logprob is furthest from the recomputed one."""

    sample: int
    position: int
    token: int
    rollout: float
    recomputed: float

    @property
    def error(self) -> float:
        return abs(self.recomputed - self.rollout)


@dataclass
class SampleAudit:
    """One sample's figures; routing ones are zero when the sample carries no routing."""

    index: int
    tokens: int
    trained: int
    max_error: float = 0.0
    mean_error: float = 0.0
    beyond_tolerance: int = 0
    routed_positions: int = 0
    routed_matching: int = 0
    # Positions whose row is all zeros on a routed layer: the engine reported none.
    routed_missing: int = 0
    # The first positions whose recorded experts differ from the recomputed ones.
    routing_mismatches: list[int] = field(default_factory=list)
    worst: list[Position] = field(default_factory=list)
    # Response tokens sampled under a grammar (left out of the figures above), and the
    # largest and mean |recomputed - rollout| over them.
    constrained: int = 0
    constrained_max_error: float = 0.0
    constrained_mean_error: float = 0.0

    @property
    def routing_share(self) -> float:
        return self.routed_matching / self.routed_positions if self.routed_positions else 1.0


@dataclass
class AuditReport:
    """Every sample's audit and the totals the verdict is taken on."""

    model: str
    tolerance: float
    min_routing_share: float
    samples: list[SampleAudit]

    @property
    def trained(self) -> int:
        return sum(s.trained for s in self.samples)

    @property
    def max_error(self) -> float:
        return max((s.max_error for s in self.samples), default=0.0)

    @property
    def mean_error(self) -> float:
        total = sum(s.mean_error * s.trained for s in self.samples)
        return total / self.trained if self.trained else 0.0

    @property
    def within_tolerance(self) -> int:
        """Trained tokens whose recomputed logprob is within the tolerance."""
        return self.trained - sum(s.beyond_tolerance for s in self.samples)

    @property
    def routed_positions(self) -> int:
        return sum(s.routed_positions for s in self.samples)

    @property
    def constrained(self) -> int:
        """Response tokens sampled under a grammar, audited apart."""
        return sum(s.constrained for s in self.samples)

    @property
    def constrained_max_error(self) -> float:
        return max((s.constrained_max_error for s in self.samples), default=0.0)

    @property
    def routing_share(self) -> float:
        positions = self.routed_positions
        return sum(s.routed_matching for s in self.samples) / positions if positions else 1.0

    @property
    def ok(self) -> bool:
        return self.max_error <= self.tolerance and self.routing_share >= self.min_routing_share

    def worst(self, n: int = 5) -> list[Position]:
        every = [w for s in self.samples for w in s.worst]
        return sorted(every, key=lambda w: -w.error)[:n]

    def table(self) -> str:
        lines = [
            f"recompute audit against {self.model} (float32, tolerance {self.tolerance:g})",
            "| sample | tokens | trained | max abs err | mean abs err | routed positions | "
            "routing match |",
            "|---|---|---|---|---|---|---|",
        ]
        for s in self.samples:
            routing = f"{s.routing_share:.2%}" if s.routed_positions else "-"
            lines.append(
                f"| {s.index} | {s.tokens} | {s.trained} | {s.max_error:.2e} | "
                f"{s.mean_error:.2e} | {s.routed_positions or '-'} | {routing} |"
            )
        routing = f"{self.routing_share:.2%}" if self.routed_positions else "-"
        lines.append(
            f"| total | {sum(s.tokens for s in self.samples)} | {self.trained} | "
            f"{self.max_error:.2e} | {self.mean_error:.2e} | {self.routed_positions or '-'} | "
            f"{routing} |"
        )
        lines.append(
            f"trained tokens within {self.tolerance:g}: {self.within_tolerance} of {self.trained}"
            + (
                f"; positions whose routing matches: {sum(s.routed_matching for s in self.samples)}"
                f" of {self.routed_positions}"
                if self.routed_positions
                else ""
            )
        )
        if self.constrained:
            lines.append(
                f"constrained tokens (sampled under a grammar, their logprobs the grammar's; "
                f"not held to the tolerance): {self.constrained}, max abs err "
                f"{self.constrained_max_error:.2e}"
            )
        worst = self.worst()
        if worst:
            lines.append("worst positions (sample, position, token: rollout vs recomputed):")
            lines += [
                f"  {w.sample}, {w.position}, {w.token}: {w.rollout:.6f} vs {w.recomputed:.6f} "
                f"(|err| {w.error:.2e})"
                for w in worst
            ]
        for s in self.samples:
            if s.routing_mismatches:
                lines.append(
                    f"sample {s.index}: routing differs first at positions "
                    f"{', '.join(map(str, s.routing_mismatches))}"
                    + (f" ({s.routed_missing} positions without rows)" if s.routed_missing else "")
                )
        return "\n".join(lines)


def recompute_samples(
    model: CausalLM | str | os.PathLike[str],
    samples: Sequence[Sample],
    *,
    temperature: float = 1.0,
    tolerance: float = DEFAULT_TOLERANCE,
    min_routing_share: float = 1.0,
    worst: int = 5,
) -> AuditReport:
    """Recompute every sample's trained logprobs and routed experts with `model` (a
    `CausalLM` or a model directory) and report how far the rollout's are (module docstring).
    `temperature` is the one the rollout sampled at (its logprobs are at that temperature)."""
    lm = model if isinstance(model, CausalLM) else CausalLM(model)
    audits = [
        _audit_one(lm, i, sample, temperature, tolerance, worst) for i, sample in enumerate(samples)
    ]
    return AuditReport(str(Path(lm.path)), tolerance, min_routing_share, audits)


def _audit_one(
    lm: CausalLM, index: int, sample: Sample, temperature: float, tolerance: float, worst: int
) -> SampleAudit:
    tokens = np.asarray(sample.tokens, dtype=np.int64)
    n = len(tokens)
    response = int(sample.response_length)
    mask = np.asarray(sample.loss_mask)
    rollout = np.asarray(sample.rollout_log_probs, dtype=np.float64)
    if len(mask) != response or len(rollout) != response or not 0 < response < n:
        raise ModelError(
            f"sample {index}: loss_mask ({len(mask)}) and rollout_log_probs ({len(rollout)}) "
            f"must cover the response ({response} of {n} tokens)"
        )
    constrained = sample.constrained.astype(bool)
    audit = SampleAudit(index, n, int(np.count_nonzero(mask & ~constrained)))
    images = _images(lm, index, sample)
    hidden, rows = lm.forward(tokens[:-1].tolist(), images=images)
    # Response token i sits at position n - response + i and is predicted from the one before.
    held = np.flatnonzero(constrained)
    if len(held):
        at = n - response + held
        apart = lm.logprobs(hidden[at - 1], tokens[at].tolist(), temperature)
        apart_errors = np.abs(apart - rollout[held])
        audit.constrained = len(held)
        audit.constrained_max_error = float(apart_errors.max())
        audit.constrained_mean_error = float(apart_errors.mean())
    trained = np.flatnonzero(mask & ~constrained)
    positions = n - response + trained
    if len(trained):
        recomputed = lm.logprobs(hidden[positions - 1], tokens[positions].tolist(), temperature)
        errors = np.abs(recomputed - rollout[trained])
        audit.max_error = float(errors.max())
        audit.mean_error = float(errors.mean())
        audit.beyond_tolerance = int(np.count_nonzero(errors > tolerance))
        for k in np.argsort(-errors, kind="stable")[:worst]:
            audit.worst.append(
                Position(
                    index,
                    int(positions[k]),
                    int(tokens[positions[k]]),
                    float(rollout[trained[k]]),
                    float(recomputed[k]),
                )
            )
    if sample.routed_experts is not None:
        _audit_routing(lm, audit, np.asarray(sample.routed_experts), rows)
    return audit


@dataclass(frozen=True)
class _Image:
    """One of a sample's images as the forward pass reads it (`model.vision.ModelImage`)."""

    data: bytes
    grid_thw: tuple[int, int, int]


def _images(lm: CausalLM, index: int, sample: Sample) -> list[_Image]:
    """The sample's images, checked against its tokens (`Sample.multimodal_inputs`)."""
    inputs = sample.multimodal_inputs()
    if inputs is None:
        return []
    if lm.vision is None:
        raise ModelError(f"sample {index} carries images but {lm.path} is a text model")
    images = [
        _Image(data, (int(t), int(h), int(w)))
        for data, (t, h, w) in zip(inputs["images"], inputs["image_grid_thw"], strict=True)
    ]
    tokens = sample.tokens[:-1].tolist()
    try:
        lm.vision.check(tokens, images)
    except ModelError as exc:
        raise ModelError(f"sample {index}: {exc}") from None
    starts = [at for at, _ in image_runs(np.asarray(tokens), lm.vision.pad_id)]
    if starts != inputs["image_offsets"]:
        raise ModelError(
            f"sample {index}: its images are at offsets {inputs['image_offsets']} but its image "
            f"tokens start at {starts}"
        )
    return images


def _audit_routing(
    lm: CausalLM, audit: SampleAudit, recorded: np.ndarray, rows: np.ndarray | None
) -> None:
    if rows is None or lm.routing is None:
        raise ModelError(f"sample {audit.index} carries routed experts but {lm.path} is no MoE")
    fed = len(rows)  # every position but the last, which nothing is computed from
    if recorded.ndim != 3 or recorded.shape[1:] != rows.shape[1:] or len(recorded) < fed:
        raise ModelError(
            f"sample {audit.index}: routed experts of shape {recorded.shape} do not fit "
            f"{lm.path}'s routing {lm.routing} over {fed + 1} tokens"
        )
    held = np.sort(recorded[:fed].astype(np.int64), axis=-1)
    computed = np.sort(rows.astype(np.int64), axis=-1)
    same = (held == computed).all(axis=(1, 2))
    routed_layers = (computed != 0).any(axis=(0, 2))
    missing = (held[:, routed_layers] == 0).all(axis=(1, 2)) if routed_layers.any() else None
    audit.routed_positions = fed
    audit.routed_matching = int(same.sum())
    audit.routed_missing = 0 if missing is None else int(missing.sum())
    audit.routing_mismatches = [int(p) for p in np.flatnonzero(~same)[:5]]
