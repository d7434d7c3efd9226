"""A finished session's memory goes back to the system: what held it after the session was
done, each shown in a process of its own (its resident set, its heaps) so nothing of the test
run blurs the figures. `benches/image_memory.py` measures the target: RSS after every session
with a 20 MB image finished within 10% of before.
"""

from __future__ import annotations

import asyncio
import platform
import subprocess
import sys
import time

import pytest

from tokentrail.adapter.offload import Offload, Settler

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")


def run(code: str, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


# Which heap a new thread's allocation comes from: the main one ([heap]) or one of its own.
THREAD_HEAP = """
import ctypes, sys, threading
from tokentrail.adapter.http.memory import map_large_buffers
if sys.argv[1] == "serve":
    assert map_large_buffers()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
got = {}
def grab():
    got["at"] = libc.malloc(4000)
thread = threading.Thread(target=grab)
thread.start()
thread.join()
heap = next(line for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]"))
low, high = (int(x, 16) for x in heap.split()[0].split("-"))
print("main" if low <= got["at"] < high else "own")
"""


@glibc
def test_serve_makes_every_thread_allocate_from_the_main_heap() -> None:
    # A worker's own heap keeps its freed top resident whatever `malloc_trim` is asked: after
    # ten 20 MB image sessions, 20-26 MB in each worker's heap (`adapter.http.memory`).
    assert run(THREAD_HEAP, "plain") == "own"
    assert run(THREAD_HEAP, "serve") == "main"


# A 64 MiB image stored in a journal's `images` table, then let go of.
STORED = """
import gc, os, shutil, sqlite3, sys, tempfile
from tokentrail.adapter.http.memory import map_large_buffers, rss
from tokentrail.storage.journal.format import IMAGES_TABLE
from tokentrail.storage.journal.images import StoredImage, StoredImages
map_large_buffers()
scratch = tempfile.mkdtemp()
db = sqlite3.connect(os.path.join(scratch, "j.db"), isolation_level=None)
db.execute(IMAGES_TABLE)
before = rss()
image = StoredImage("d" * 64, "image/png", bytes(64 << 20))
db.execute("BEGIN")
StoredImages().insert(db, [image])
db.execute("COMMIT")
del image
gc.collect()
print((rss() - before) >> 20)
db.close()
shutil.rmtree(scratch)
"""


@glibc
def test_the_journal_keeps_no_copy_of_an_image_it_stored() -> None:
    # SQLite held its copy of the bound blob in the cached statement until the next insert:
    # the last image of every burst stayed in memory for good.
    assert int(run(STORED)) < 16


def test_a_pass_settles_once_the_pokes_are_quiet() -> None:
    """A burst of pokes (finishes) gets one collection and trim, after the last of them."""
    offload = Offload(1)
    settler = Settler(offload, delay_s=0.2)

    async def go() -> list[int]:
        seen = []
        for _ in range(5):
            settler.poke()
            await asyncio.sleep(0.05)
            seen.append(settler.settled)
        quiet = time.monotonic() + 5
        while settler.settled == 0 and time.monotonic() < quiet:
            await asyncio.sleep(0.05)
        seen.append(settler.settled)
        await asyncio.sleep(0.4)
        seen.append(settler.settled)
        return seen

    seen = asyncio.run(go())
    offload.close()
    assert seen == [0, 0, 0, 0, 0, 1, 1]
