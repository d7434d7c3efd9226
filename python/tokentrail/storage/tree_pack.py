"""Samples packed as prefix trees, one per group: what `tokentrail pack` writes.

A group is the samples whose `metadata["group"]` is the same (sessions opened with one group
id, a GRPO group's rollouts of one task); a sample without a group is its session's own group.
Each group merges into one `PrefixTree` at its longest common prefixes; the result says, per
group and per session, how many tokens the rows hold and how many the tree does. A `.npz` file
holds every group's arrays and round-trips them exactly.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from tokentrail.errors import TreeError
from tokentrail.trajectory.layout_stats import TreeStats, TreeStatsJson
from tokentrail.trajectory.prefix_tree import PrefixTree, build_prefix_tree
from tokentrail.trajectory.sample import Sample

# Bumped when the file layout changes; `read_tree_pack` refuses layouts it does not know.
_SCHEMA = 1
# The fields of a `PrefixTree` that are not numpy arrays, kept in the file's JSON header.
_LISTS = ("versions", "row_sessions", "row_metadata")
_SCALARS = ("label_conflicts",)


def group_of(sample: Sample) -> str:
    """The group a sample packs into: its `group`, else its session's own."""
    group = sample.metadata.get("group")
    if group is not None:
        return str(group)
    return f"session:{sample.metadata.get('session_id', '')}"


class TreePackStatsJson(TypedDict):
    """`TreePack.to_dict`: the layout's savings, all groups, per group, per session."""

    total: TreeStatsJson
    groups: dict[str, TreeStatsJson]
    sessions: dict[str, TreeStatsJson]


@dataclass
class TreePack:
    """One prefix tree per group, in the order the groups first appear."""

    trees: dict[str, PrefixTree]

    @property
    def stats(self) -> TreeStats:
        """All groups together."""
        parts = [t.stats for t in self.trees.values()]
        return TreeStats(
            sum(p.rows for p in parts),
            sum(p.row_tokens for p in parts),
            sum(p.tree_tokens for p in parts),
        )

    def group_stats(self) -> dict[str, TreeStats]:
        return {group: tree.stats for group, tree in self.trees.items()}

    def session_stats(self) -> dict[str, TreeStats]:
        """Per session: its rows' tokens, and the distinct tree tokens they use in its group."""
        out: dict[str, TreeStats] = {}
        for tree in self.trees.values():
            out.update(tree.session_stats())
        return out

    def to_dict(self) -> TreePackStatsJson:
        """The stats, JSON-ready: all groups, per group, per session."""
        return {
            "total": self.stats.to_dict(),
            "groups": {g: s.to_dict() for g, s in self.group_stats().items()},
            "sessions": {sid: s.to_dict() for sid, s in self.session_stats().items()},
        }


def pack_tree(samples: Sequence[Sample]) -> TreePack:
    """Group `samples` (`group_of`) and merge each group into one prefix tree. A session's
    samples must all be in one group; raises `TreeError` otherwise, or for what
    `build_prefix_tree` refuses."""
    groups: dict[str, list[Sample]] = {}
    seen: dict[str, str] = {}
    for sample in samples:
        group = group_of(sample)
        sid = str(sample.metadata.get("session_id", ""))
        if seen.setdefault(sid, group) != group:
            raise TreeError(f"session {sid!r} has samples in groups {seen[sid]!r} and {group!r}")
        groups.setdefault(group, []).append(sample)
    return TreePack({group: build_prefix_tree(rows) for group, rows in groups.items()})


# --- Files ---------------------------------------------------------------------------------------


def write_tree_pack(path: str | os.PathLike[str], pack: TreePack) -> None:
    """Write every group's tree to one `.npz`: arrays as `g<i>.<field>`, the rest (group
    names, versions, sessions, row metadata, stats) in a JSON header."""
    arrays: dict[str, np.ndarray] = {}
    header: dict[str, Any] = {"schema": _SCHEMA, "groups": [], "stats": pack.to_dict()}
    for i, (group, tree) in enumerate(pack.trees.items()):
        entry: dict[str, Any] = {"name": group}
        for f in fields(PrefixTree):
            value = getattr(tree, f.name)
            if f.name in _LISTS or f.name in _SCALARS:
                entry[f.name] = value
            elif value is not None:
                arrays[f"g{i}.{f.name}"] = value
        header["groups"].append(entry)
    try:
        text = json.dumps(header, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise TreeError(f"row metadata is not JSON: {err}") from None
    with Path(path).open("wb") as out:
        np.savez(out, header=np.array(text), **arrays)  # type: ignore[arg-type]


def read_tree_pack(path: str | os.PathLike[str]) -> TreePack:
    """The `TreePack` `write_tree_pack` wrote to `path`."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        header = json.loads(str(arrays.pop("header")))
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise TreeError(f"{path}: not a tokentrail tree pack: {err}") from None
    if not isinstance(header, dict) or header.get("schema") != _SCHEMA:
        raise TreeError(f"{path}: not a tokentrail tree pack (schema {header.get('schema')})")
    trees = {}
    for i, entry in enumerate(header["groups"]):
        values: dict[str, Any] = {}
        for f in fields(PrefixTree):
            if f.name in _LISTS or f.name in _SCALARS:
                values[f.name] = entry[f.name]
            else:
                values[f.name] = arrays.get(f"g{i}.{f.name}")
        missing = [k for k, v in values.items() if v is None and k not in _OPTIONAL]
        if missing:
            raise TreeError(f"{path}: group {entry['name']!r} lacks {missing}")
        trees[str(entry["name"])] = PrefixTree(**values)
    return TreePack(trees)


_OPTIONAL = ("routed_experts", "indexer_topk")
