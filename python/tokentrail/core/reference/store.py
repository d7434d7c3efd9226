"""The reference of the compact turn store (`rust/store.rs`): every turn of one session, a
prompt kept as the prefix it shares with its parent's tokens plus a tail, and the replay tapes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tokentrail.core.ids import LogprobArray, MaskArray, RowArray, TokenArray
from tokentrail.core.reference.linearize import (
    Linearized,
    lcp,
    linearize,
    logprob_list,
    token_list,
)
from tokentrail.core.reference.tape import FINAL_TOKEN, Tape, TapeShape, given
from tokentrail.errors import PolicyError, ReplayError

ROUTED, INDEXER = "routed_experts", "indexer_topk"


class TurnStore:
    """Every turn of one session, stored compactly: a prompt is the prefix it shares with its
    parent turn's tokens (prompt + output) plus its own tail, so memory grows with the unique
    tokens of the session, not with turns x context.

    Turn ids are 0, 1, 2, ... in push order. `routed_experts=(layers, top_k, num_experts)` and
    `indexer_topk=(layers, top_k)` make it keep those replay tapes: a position's row is kept
    once, by its origin, the turn that first fed it forward (positions before a turn's origin,
    the prefix it shares with its parent's tokens short of the parent's last token, are its
    parents').
    """

    def __init__(
        self,
        *,
        routed_experts: tuple[int, int, int] | None = None,
        indexer_topk: tuple[int, int] | None = None,
    ) -> None:
        self._tapes: dict[str, Tape] = {}
        if routed_experts is not None:
            self._tapes[ROUTED] = Tape(ROUTED, TapeShape.routing(*routed_experts))
        if indexer_topk is not None:
            self._tapes[INDEXER] = Tape(INDEXER, TapeShape.indexer(*indexer_topk))
        self._parent: list[int] = []
        self._prefix: list[int] = []
        self._tail: list[list[int]] = []
        self._output: list[list[int]] = []
        self._logprobs: list[list[float] | None] = []
        # The last turn materialized: the next push almost always continues it.
        self._cached: tuple[int, list[int]] = (-1, [])

    def __len__(self) -> int:
        return len(self._parent)

    @property
    def routed_experts_shape(self) -> tuple[int, int, int] | None:
        tape = self._tapes.get(ROUTED)
        return None if tape is None else (tape.shape.layers, tape.shape.width, tape.shape.max + 1)

    @property
    def indexer_topk_shape(self) -> tuple[int, int] | None:
        tape = self._tapes.get(INDEXER)
        return None if tape is None else (tape.shape.layers, tape.shape.width)

    def push(
        self,
        parent: int,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        *,
        routed_experts: object = None,
        indexer_topk: object = None,
    ) -> int:
        """Store a turn; `parent` is the turn whose tokens its prompt continues, or -1. Each
        replay argument is None, a reason it has no rows, or `(start, rows)`.

        Checked in order: the ids, the replay arguments' form, the logprobs, the parent, then
        each replay argument against its tape (one the store does not keep is refused).
        """
        prompt = token_list(prompt_ids, "prompt_ids")
        output = token_list(output_ids, "output_ids")
        replay = {
            ROUTED: given(routed_experts, ROUTED, len(prompt)),
            INDEXER: given(indexer_topk, INDEXER, len(prompt)),
        }
        lps = logprob_list(logprobs, len(output))
        self._check_parent(parent)
        for channel, value in replay.items():
            tape = self._tapes.get(channel)
            if tape is None:
                if value is not None:
                    raise ReplayError(
                        f"{channel}: given, but the store was made without a {channel} shape"
                    )
                continue
            tape.check(value, len(prompt), len(output))
        prefix = lcp(self._tokens(parent), prompt) if parent >= 0 else 0
        self._parent.append(parent)
        self._prefix.append(prefix)
        self._tail.append(prompt[prefix:])
        self._output.append(output)
        self._logprobs.append(lps)
        turn = len(self) - 1
        for channel, tape in self._tapes.items():
            tape.append(replay[channel], self._origin(turn), self._full_len(turn))
        return turn

    def _check_parent(self, parent: int) -> None:
        if not -1 <= parent < len(self):
            raise PolicyError(f"parent turn {parent} does not exist ({len(self)} turns stored)")

    def _full_len(self, turn: int) -> int:
        return self._prefix[turn] + len(self._tail[turn]) + len(self._output[turn])

    def _origin(self, turn: int) -> int:
        """Where the turn's own positions start: its parent fed every shared token forward
        but its last."""
        parent = self._parent[turn]
        if parent < 0:
            return 0
        return min(self._prefix[turn], max(0, self._full_len(parent) - 1))

    def replay_start(self, parent: int, prompt_ids: Sequence[int]) -> int:
        """The first position whose replay rows a turn with this prompt pushed under `parent`
        would take from its own request: the start to ask the engine for."""
        prompt = token_list(prompt_ids, "prompt_ids")
        self._check_parent(parent)
        if parent < 0:
            return 0
        return min(lcp(self._tokens(parent), prompt), max(0, self._full_len(parent) - 1))

    def routed_experts(self, turn: int, length: int | None = None) -> tuple[RowArray, MaskArray]:
        """The turn's first `length` positions (default: all) of routed experts: rows
        `[length, layers, top_k]` and one `REPLAY_STATUS` code per position."""
        return self._replay_rows(ROUTED, turn, length)

    def indexer_topk(self, turn: int, length: int | None = None) -> tuple[RowArray, MaskArray]:
        """`routed_experts` for the indexer top-k tape."""
        return self._replay_rows(INDEXER, turn, length)

    def _replay_rows(
        self, channel: str, turn: int, length: int | None
    ) -> tuple[RowArray, MaskArray]:
        self._check(turn)
        full = self._full_len(turn)
        length = full if length is None else length
        tape = self._tapes.get(channel)
        if tape is None:
            raise ReplayError(f"{channel}: the store was made without a {channel} shape")
        if length > full:
            raise ReplayError(f"{channel}: length {length} is past turn {turn}'s {full} tokens")
        shape = tape.shape
        rows = np.zeros((length, shape.layers, shape.width), dtype=shape.dtype)
        status = np.zeros(length, dtype=np.uint8)
        if length == full and full > 0:
            status[full - 1] = FINAL_TOKEN
        at, hi = turn, min(length, max(0, full - 1))
        while at >= 0 and hi > 0:
            lo = min(self._origin(at), hi)
            tape.fill(at, lo, hi, rows, status)
            at, hi = self._parent[at], lo
        return rows, status

    def _check(self, turn: int) -> None:
        if not 0 <= turn < len(self):
            raise PolicyError(f"turn {turn} does not exist ({len(self)} turns stored)")

    def prompt_ids(self, turn: int) -> TokenArray:
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

    def tokens(self, turn: int) -> TokenArray:
        """The turn's prompt then output ids."""
        self._check(turn)
        return np.asarray(self._tokens(turn), dtype=np.uint32)

    def _tokens(self, turn: int) -> list[int]:
        if self._cached[0] == turn:
            return self._cached[1]
        full = self._build(turn)
        self._cached = (turn, full)
        return full

    def output_ids(self, turn: int) -> TokenArray:
        self._check(turn)
        return np.asarray(self._output[turn], dtype=np.uint32)

    def logprobs(self, turn: int) -> LogprobArray | None:
        self._check(turn)
        lps = self._logprobs[turn]
        return None if lps is None else np.asarray(lps, dtype=np.float32)

    def output_len(self, turn: int) -> int:
        self._check(turn)
        return len(self._output[turn])

    def nbytes(self) -> int:
        """Bytes the stored ids and logprobs take: 4 per id, 4 per logprob, 8 per turn, and
        each replay tape's values at their element size."""
        ids = sum(len(t) for t in self._tail) + sum(len(o) for o in self._output)
        lps = sum(len(lp) for lp in self._logprobs if lp is not None)
        tapes = sum(tape.nbytes() for tape in self._tapes.values())
        return 4 * ids + 4 * lps + 8 * len(self) + tapes

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
