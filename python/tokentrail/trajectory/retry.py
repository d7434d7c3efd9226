"""Retries in a session's tree: the recorded turns a request repeats, and what answering it
again or afresh does to them.

A request repeats a recorded turn when it has the same prompt (same routing path, same prompt
ids) and nothing was built on that turn yet: the harness may never have got its reply. Answered
again, the turn counts one more `retries`; generated afresh, the new turn supersedes it and the
ledger masks it as `superseded`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from tokentrail.core.ids import TokenArray
from tokentrail.trajectory.tree import Node


def unanswered(
    node: Node, prompt: TokenArray, prompt_of: Callable[[int], TokenArray]
) -> list[Node]:
    """The generated children of `node` (the end of a prompt's path) that a request with prompt
    ids `prompt` repeats; `prompt_of(turn id)` reads a stored turn's prompt ids."""
    out = []
    for child in node.children:
        turn = child.turn
        if turn is None or child.children or turn.superseded:
            continue
        if np.array_equal(prompt_of(turn.id), prompt):
            out.append(child)
    return out


def supersede(nodes: list[Node]) -> None:
    for node in nodes:
        if node.turn is not None:
            node.turn = dataclasses.replace(node.turn, superseded=True)


def answered_again(node: Node) -> None:
    if node.turn is not None:
        node.turn = dataclasses.replace(node.turn, retries=node.turn.retries + 1)
