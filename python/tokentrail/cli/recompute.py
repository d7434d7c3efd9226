"""`tokentrail audit --recompute MODEL_DIR SAMPLES`: recompute every trained token's logprob and
every position's routed experts with the model, and exit 1 where the samples disagree.

SAMPLES is a sample file (.npz, .jsonl, .parquet), a JSON file of `/finish` answers (one per
line, or a list), or a journal (its finished sessions' samples, as recorded).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The recompute flags of `tokentrail audit`."""
    from tokentrail.model.audit import DEFAULT_TOLERANCE

    group = parser.add_argument_group("recompute (a real model recomputes the samples)")
    group.add_argument(
        "--recompute",
        metavar="MODEL_DIR",
        default=None,
        help="recompute the logprobs and routed experts of TARGET's samples with this model "
        "(a directory, or tiny:NAME) and exit 1 beyond --tolerance",
    )
    group.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help=f"largest |recomputed - rollout| logprob allowed (default {DEFAULT_TOLERANCE:g}, "
        "float32 on CPU)",
    )
    group.add_argument(
        "--min-routing-match",
        type=float,
        default=1.0,
        help="smallest share of positions whose routed experts must match (default 1.0)",
    )
    group.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="the temperature the rollout sampled at (its logprobs are at it)",
    )


def run(args: argparse.Namespace) -> int:
    from tokentrail.engines.transformers_lm import model_dir
    from tokentrail.errors import TokentrailError
    from tokentrail.model.audit import recompute_samples

    try:
        samples = read_any(Path(args.target))
        if not samples:
            print(f"FAIL: {args.target} holds no samples")
            return 1
        report = recompute_samples(
            model_dir(args.recompute),
            samples,
            temperature=args.temperature,
            tolerance=args.tolerance,
            min_routing_share=args.min_routing_match,
        )
    except (TokentrailError, OSError) as exc:
        print(f"tokentrail audit: {exc}", file=sys.stderr)
        return 2
    print(report.table())
    if report.ok:
        print("ok: every trained token carries the logprob and routing the model computes")
        return 0
    print(
        f"FAIL: max |err| {report.max_error:.3g} (tolerance {report.tolerance:g}), routing "
        f"match {report.routing_share:.4%} (at least {report.min_routing_share:.2%})"
    )
    return 1


def read_any(path: Path) -> list[Any]:
    """The samples of a sample file, a JSON(L) of `/finish` answers, or a journal."""
    from tokentrail.storage.export import read_samples
    from tokentrail.trajectory.sample import Sample

    if path.suffix in (".npz", ".parquet"):
        return read_samples(path)
    if path.suffix in (".json", ".jsonl"):
        text = path.read_text(encoding="utf-8")
        try:
            records: Any = [json.loads(text)]
        except json.JSONDecodeError:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        if len(records) == 1 and isinstance(records[0], list):
            records = records[0]
        samples = []
        for record in records:
            if isinstance(record, dict) and "samples" in record:
                samples += [Sample.from_dict(s) for s in record["samples"]]
            else:
                samples.append(Sample.from_dict(record))
        return samples
    from tokentrail.storage.journal.read import read_journal
    from tokentrail.storage.replay import as_recorded

    return [s for t in as_recorded(read_journal(path)).values() for s in t.samples]
