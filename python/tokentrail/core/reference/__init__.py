"""Pure-Python reference of tokentrail's hot path.

Same functions, same names and same semantics as the Rust core (`tokentrail._core`, whose stub
`_core.pyi` declares them for both), one module per core file; the differential tests hold the
two together and the benchmarks measure one against the other.
"""

from __future__ import annotations

from tokentrail.core.reference.body import BodyIndex, diff_bodies, index_body
from tokentrail.core.reference.detokenize import Detokenizer
from tokentrail.core.reference.http_chunks import http_chunks
from tokentrail.core.reference.linearize import (
    CLEAN,
    FORK,
    POLICIES,
    REALIGN,
    BuiltSample,
    Drift,
    DriftEvent,
    Linearized,
    SampleBuilder,
    Span,
    common_prefix_len,
    linearize,
    token_list,
)
from tokentrail.core.reference.numbers import number_array
from tokentrail.core.reference.pack import Packed, pack
from tokentrail.core.reference.sglang_run import sglang_run
from tokentrail.core.reference.sse_run import sse_run
from tokentrail.core.reference.store import TurnStore
from tokentrail.core.reference.tape import REPLAY_STATUS
from tokentrail.core.reference.tokenize import IncrementalTokenizer

__all__ = [
    "CLEAN",
    "FORK",
    "POLICIES",
    "REALIGN",
    "REPLAY_STATUS",
    "BodyIndex",
    "BuiltSample",
    "Detokenizer",
    "Drift",
    "DriftEvent",
    "IncrementalTokenizer",
    "Linearized",
    "Packed",
    "SampleBuilder",
    "Span",
    "TurnStore",
    "common_prefix_len",
    "diff_bodies",
    "http_chunks",
    "index_body",
    "linearize",
    "number_array",
    "pack",
    "sglang_run",
    "sse_run",
    "token_list",
]
