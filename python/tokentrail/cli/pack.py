"""`tokentrail pack`: sample files (what `journal export` and `/finish` write) packed as one
prefix tree per group, with what the tree saves per group and in total."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_command(sub: Any) -> None:
    pack = sub.add_parser(
        "pack", help="pack samples as prefix trees (one per group): each shared token once"
    )
    pack.add_argument("samples", nargs="+", help=".npz, .jsonl or .parquet sample files")
    pack.add_argument("--out", default=None, help="write the trees to this .npz")
    pack.add_argument("--json", action="store_true", help="print the stats as JSON")
    pack.set_defaults(func=_pack)


def _pack(args: argparse.Namespace) -> int:
    from tokentrail.errors import ExportError, TreeError
    from tokentrail.storage.export import read_samples
    from tokentrail.storage.tree_pack import pack_tree, write_tree_pack

    try:
        samples = [s for path in args.samples for s in read_samples(path)]
        packed = pack_tree(samples)
        if args.out is not None:
            write_tree_pack(args.out, packed)
    except (ExportError, TreeError, FileNotFoundError) as exc:
        print(f"tokentrail pack: {exc}")
        return 1
    if args.json:
        print(json.dumps(packed.to_dict(), indent=2))
        return 0
    print(f"{'group':<32} {'rows':>5} {'row tokens':>11} {'tree tokens':>11} {'saved':>7}")
    for group, stats in [*packed.group_stats().items(), ("all groups", packed.stats)]:
        saved = 100 * stats.saved_tokens / stats.row_tokens if stats.row_tokens else 0.0
        print(
            f"{group:<32} {stats.rows:>5} {stats.row_tokens:>11} {stats.tree_tokens:>11} "
            f"{saved:>6.1f}%"
        )
    if args.out is not None:
        print(f"wrote {len(packed.trees)} trees to {args.out}")
    return 0
