"""The recompute audit on one torch thread, in the test process and in the `tokentrail serve`
subprocesses it starts (`$TOKENTRAIL_TORCH_THREADS`), beside an engine on the other core."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from tokentrail.model.forward import THREADS_ENV, set_threads


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    before = os.environ.get(THREADS_ENV)
    os.environ[THREADS_ENV] = "1"
    set_threads(1)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(THREADS_ENV, None)
        else:
            os.environ[THREADS_ENV] = before
