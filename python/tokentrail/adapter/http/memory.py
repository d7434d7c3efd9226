"""The process's memory as a budget (`--max-memory`): admission refuses work that would take the
resident set past it, and large buffers are mapped so that freeing them returns them.

A request is admitted while the resident set plus what it may cost (its body several times
over: the bytes read, the parsed text, an image's decoded bytes and the base64 sent to the
engine) stays within the budget; a request that opens a session must leave a tenth of the
budget free, so the sessions already open can go on. A refusal is a 429 (OpenAI) or a 529
`overloaded_error` (Anthropic) with `Retry-After`: a retry passes once finished sessions have
given their memory back. `/finish` and the other routes are never refused.

The open sessions' replay rows (routed experts, indexer top-k: a 128K-token turn at 48 layers x
top-8 is 48 MiB) take at most `REPLAY_SHARE` of the budget on the heap; the sessions beyond it
keep theirs in a file each (`trajectory.replay_pool`), next to the journal when there is one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable
from pathlib import Path

from tokentrail.errors import OverMemory

logger = logging.getLogger(__name__)

__all__ = [
    "REPLAY_SHARE",
    "MemoryBudget",
    "default_max_memory",
    "map_large_buffers",
    "machine_memory",
    "rss",
]

# A request holds its body this many times over while it is read, parsed, translated and its
# images decoded and sent (bytes, text, decoded bytes, base64 for the engine).
REQUEST_FACTOR = 4
# A new session must leave this share of the budget free for the open ones.
NEW_SESSION_SHARE = 0.9
# Replay rows of open sessions on the heap: at most this share of the budget.
REPLAY_SHARE = 0.5
# The default budget: this share of the machine's memory (or of the cgroup's limit).
DEFAULT_SHARE = 0.5
# Allocations from this size on are their own mapping, returned to the system when freed.
MMAP_THRESHOLD = 1024 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameters
_M_ARENA_MAX = -8
# Every thread's allocations in the one main heap: see `map_large_buffers`.
ARENA_MAX = 1
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """The process's resident set, in bytes (`/proc/self/statm`; 0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def machine_memory() -> int:
    """The memory this process may use: the machine's, or its cgroup's limit if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


def default_max_memory() -> int:
    """`--max-memory` left at 0: half of `machine_memory()`."""
    return int(machine_memory() * DEFAULT_SHARE)


def map_large_buffers() -> bool:
    """Make glibc give freed memory back to the system. Call it before any thread starts.

    Allocations of `MMAP_THRESHOLD` and more are mappings of their own, returned at once when
    freed: glibc otherwise raises that threshold to the largest block freed so far (up to 32
    MiB), and later 20 MB images are carved out of its heaps, where they stay in the resident
    set after they are freed. And every thread allocates from the main heap (`ARENA_MAX`):
    glibc gives each thread a heap of its own, whose free top (a 20 MB image's pieces, once
    coalesced) `malloc_trim` leaves resident: after ten 20 MB image sessions 20-26 MB stayed
    in each worker's heap. Threads contend for one heap's lock only outside the interpreter
    (the GIL serializes the rest), and small objects never reach it (pymalloc).
    False where there is no glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        libc = None
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    arenas = bool(libc.mallopt(_M_ARENA_MAX, ARENA_MAX))
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and arenas


class MemoryBudget:
    """Admission against `max_bytes` of resident memory (0: `default_max_memory()`)."""

    def __init__(self, max_bytes: int = 0, resident: Callable[[], int] = rss) -> None:
        self.max_bytes = max_bytes or default_max_memory()
        self._resident = resident

    @property
    def replay_bytes(self) -> int:
        """What the open sessions' replay rows may take on the heap (`REPLAY_SHARE`)."""
        return int(self.max_bytes * REPLAY_SHARE)

    def admit(self, body_bytes: int | None, *, new_session: bool) -> None:
        """Refuse (`OverMemory`) a request of `body_bytes` (None: not announced) that would take
        the resident set past the budget, or, opening a session, past its share of it."""
        held = self._resident()
        cost = REQUEST_FACTOR * (body_bytes or 0)
        limit = int(self.max_bytes * NEW_SESSION_SHARE) if new_session else self.max_bytes
        if held + cost <= limit:
            return
        what = "a new session" if new_session else "this request"
        logger.warning(
            "memory budget: %s refused (%d MB held + %d MB for it > %d MB%s, --max-memory)",
            what,
            held >> 20,
            cost >> 20,
            limit >> 20,
            " for new sessions" if new_session else "",
        )
        raise OverMemory(
            f"the adapter's memory is at its budget ({held >> 20} MB held, {what} may take "
            f"{cost >> 20} MB more of {limit >> 20} MB, --max-memory); retry shortly",
            retry_after_s=5,
        )
