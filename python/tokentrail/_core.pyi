"""Type stubs for `tokentrail._core`, the Rust hot path.

Same names and semantics as `tokentrail.core.reference`, which is the spec; `core.backend.Core`
types both backends by this stub.
"""

from collections.abc import Sequence
from typing import Final, TypeAlias, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "__version__",
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
]

_TokenIds: TypeAlias = Sequence[int | np.integer] | npt.NDArray[np.integer]
_Logprobs: TypeAlias = Sequence[float] | npt.NDArray[np.floating] | None
_TurnInput: TypeAlias = tuple[_TokenIds, _TokenIds, _Logprobs]
_Ints: TypeAlias = Sequence[int | np.integer] | npt.NDArray[np.integer]
_Floats: TypeAlias = Sequence[float] | npt.NDArray[np.floating]
# A replay argument of `TurnStore.push`: None, a reason it has no rows, or `(start, rows)`.
_Replay: TypeAlias = str | tuple[int, npt.ArrayLike] | None
_Rows: TypeAlias = npt.NDArray[np.unsignedinteger | np.signedinteger]

__version__: Final[str]
CLEAN: Final = "clean"
REALIGN: Final = "realign"
FORK: Final = "fork"
POLICIES: Final[tuple[str, ...]]
REPLAY_STATUS: Final[tuple[str, ...]]

def common_prefix_len(a: _TokenIds, b: _TokenIds) -> int:
    """Length of the longest common prefix of two token sequences."""

@final
class Drift:
    """How an incoming prompt relates to the tokens a builder holds."""

    def __new__(cls, kind: str, at: int, drifted: int) -> Drift: ...
    @property
    def kind(self) -> str: ...
    @property
    def at(self) -> int: ...
    @property
    def drifted(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Span:
    """One turn's sampled output inside a builder: tokens [start, end)."""

    def __new__(cls, turn: int, start: int, end: int) -> Span: ...
    @property
    def turn(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...

@final
class SampleBuilder:
    """Accumulates one coherent run of turns into tokens, loss mask and logprobs."""

    def __new__(cls, policy: str = "minimal", fork_threshold: int = 1024) -> SampleBuilder: ...
    @property
    def policy(self) -> str: ...
    @property
    def fork_threshold(self) -> int: ...
    def __len__(self) -> int: ...
    def classify(self, prompt_ids: _TokenIds, output_len: int = 0) -> Drift: ...
    def append_turn(
        self,
        prompt_ids: _TokenIds,
        output_ids: _TokenIds,
        logprobs: _Logprobs = None,
        *,
        trained: bool = True,
        turn: int = 0,
    ) -> Drift:
        """Append a turn, healing a REALIGN. A FORK is refused: start a new builder."""
    def has_trained_response(self) -> bool: ...
    @property
    def tokens(self) -> npt.NDArray[np.uint32]: ...
    @property
    def loss_mask(self) -> npt.NDArray[np.uint8]: ...
    @property
    def logprobs(self) -> npt.NDArray[np.float32]: ...
    @property
    def response_start(self) -> int: ...
    @property
    def spans(self) -> list[Span]: ...
    @property
    def realigned(self) -> dict[int, int]: ...
    def finish(self, max_sample_tokens: int = 0) -> BuiltSample:
        """Cut the sample to `max_sample_tokens` (0: no limit) and return its arrays."""

@final
class BuiltSample:
    """One linearized run: `tokens` in full, `loss_mask`/`logprobs` over the response part."""

    @property
    def tokens(self) -> npt.NDArray[np.uint32]: ...
    @property
    def loss_mask(self) -> npt.NDArray[np.uint8]: ...
    @property
    def logprobs(self) -> npt.NDArray[np.float32]: ...
    @property
    def response_start(self) -> int: ...
    @property
    def truncated(self) -> bool: ...
    @property
    def turns(self) -> list[int]: ...
    @property
    def spans(self) -> list[Span]: ...
    @property
    def trained(self) -> dict[int, int]: ...
    @property
    def realigned(self) -> dict[int, int]: ...
    @property
    def truncated_tokens(self) -> dict[int, int]: ...
    chain: int
    def has_trained_response(self) -> bool:
        """Whether any token of `loss_mask` is trained."""

@final
class DriftEvent:
    """A drift decision taken while adding a turn to a run of a chain."""

    def __new__(cls, chain: int, turn: int, kind: str, at: int, drifted: int) -> DriftEvent: ...
    @property
    def chain(self) -> int: ...
    @property
    def turn(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def at(self) -> int: ...
    @property
    def drifted(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Linearized:
    """Every sample of a set of chains, with the drift decisions taken on the way."""

    @property
    def samples(self) -> list[BuiltSample]: ...
    @property
    def drifts(self) -> list[DriftEvent]: ...
    @property
    def trained(self) -> dict[int, int]: ...
    @property
    def realigned(self) -> dict[int, int]: ...
    @property
    def truncated(self) -> dict[int, int]: ...

def linearize(
    turns: Sequence[_TurnInput],
    chains: Sequence[Sequence[int]],
    *,
    policy: str = "minimal",
    fork_threshold: int = 1024,
    max_sample_tokens: int = 0,
) -> Linearized:
    """Linearize chains of turns into samples."""

@final
class Packed:
    """Samples flattened into one varlen-attention batch, read as `core.packed.PackedBatch`."""

    @property
    def tokens(self) -> npt.NDArray[np.uint32]: ...
    @property
    def cu_seqlens(self) -> npt.NDArray[np.int32]: ...
    @property
    def position_ids(self) -> npt.NDArray[np.int32]: ...
    @property
    def sample_index(self) -> npt.NDArray[np.int32]: ...
    @property
    def loss_mask(self) -> npt.NDArray[np.uint8]: ...
    @property
    def logprobs(self) -> npt.NDArray[np.float32]: ...
    @property
    def rewards(self) -> npt.NDArray[np.float32]: ...
    @property
    def advantages(self) -> npt.NDArray[np.float32]: ...
    @property
    def max_seqlen(self) -> int: ...
    @property
    def routed_experts(self) -> _Rows | None: ...
    @property
    def indexer_topk(self) -> _Rows | None: ...

def pack(
    tokens: Sequence[_TokenIds],
    loss_masks: Sequence[_Ints],
    logprobs: Sequence[_Floats],
    response_lengths: _Ints,
    rewards: _Floats,
    routed_experts: Sequence[_Rows] | None = None,
    indexer_topk: Sequence[_Rows] | None = None,
) -> Packed:
    """Pack samples into one batch for variable-length attention."""

@final
class TurnStore:
    """Every turn of one session, stored compactly: a prompt is the prefix it shares with its
    parent turn's tokens (prompt + output) plus its own tail."""

    def __new__(
        cls,
        *,
        routed_experts: tuple[int, int, int] | None = None,
        indexer_topk: tuple[int, int] | None = None,
    ) -> TurnStore: ...
    def __len__(self) -> int: ...
    @property
    def routed_experts_shape(self) -> tuple[int, int, int] | None:
        """`(layers, top_k, num_experts)` of the routed-experts tape, or None."""
    @property
    def indexer_topk_shape(self) -> tuple[int, int] | None:
        """`(layers, top_k)` of the indexer top-k tape, or None."""
    def push(
        self,
        parent: int,
        prompt_ids: _TokenIds,
        output_ids: _TokenIds,
        logprobs: _Logprobs = None,
        *,
        routed_experts: _Replay = None,
        indexer_topk: _Replay = None,
    ) -> int:
        """Store a turn; `parent` is the turn whose tokens its prompt continues, or -1."""
    def replay_start(self, parent: int, prompt_ids: _TokenIds) -> int:
        """The first position a turn with this prompt under `parent` takes rows from its own
        request for."""
    def routed_experts(
        self, turn: int, length: int | None = None
    ) -> tuple[_Rows, npt.NDArray[np.uint8]]:
        """Rows `[length, layers, top_k]` and one `REPLAY_STATUS` code per position."""
    def indexer_topk(
        self, turn: int, length: int | None = None
    ) -> tuple[_Rows, npt.NDArray[np.uint8]]:
        """`routed_experts` for the indexer top-k tape."""
    def prompt_ids(self, turn: int) -> npt.NDArray[np.uint32]: ...
    def tokens(self, turn: int) -> npt.NDArray[np.uint32]:
        """The turn's prompt then output ids."""
    def output_ids(self, turn: int) -> npt.NDArray[np.uint32]: ...
    def logprobs(self, turn: int) -> npt.NDArray[np.float32] | None: ...
    def output_len(self, turn: int) -> int: ...
    def nbytes(self) -> int:
        """Bytes the stored ids and logprobs take: 4 per id, 4 per logprob, 8 per turn, and each
        replay tape's values at their element size."""
    def heap_bytes(self) -> int:
        """Bytes held: what the store's buffers have allocated."""
    def linearize(
        self,
        chains: Sequence[Sequence[int]],
        *,
        policy: str = "minimal",
        fork_threshold: int = 1024,
        max_sample_tokens: int = 0,
    ) -> Linearized:
        """`linearize` over the stored turns: chains name turn ids."""

@final
class IncrementalTokenizer:
    """Encodes each session's prompt from the last added token it shares with the previous one.

    Built from a tokenizer.json; every result equals a full encode without special tokens added.
    """

    def __new__(cls, tokenizer_json: str, *, fast_path: bool = True) -> IncrementalTokenizer:
        """`fast_path=False` encodes through `tokenizers` even where the fast encoder fits."""
    def fork(self) -> IncrementalTokenizer: ...
    def encode(self, session: str, text: str) -> npt.NDArray[np.uint32]:
        """The ids of `text`, reusing `session`'s previous prompt up to the last safe boundary."""
    def encode_full(self, text: str) -> npt.NDArray[np.uint32]:
        """The ids of `text`, encoded in full."""
    def forget(self, session: str) -> None:
        """Drop what is kept for `session`."""
    def sessions(self) -> int:
        """How many sessions have a prompt kept."""
    @property
    def safe(self) -> bool:
        """Whether prompts are resumed after added tokens; when not, every encode is a full one."""
    @property
    def fallback_reason(self) -> str | None:
        """Why boundaries after added tokens are not safe for this tokenizer, when they are not."""
    @property
    def fast_path(self) -> bool:
        """Whether text is encoded by the core's fast encoder rather than by `tokenizers`."""
    @property
    def fast_path_reason(self) -> str | None:
        """Why text is encoded by `tokenizers`, when it is."""
    def reused_ids(self) -> int:
        """Ids taken from kept prompts instead of being encoded, over all `encode` calls."""
    def encoded_bytes(self) -> int:
        """Bytes of text actually run through the tokenizer, over all `encode` calls."""

@final
class Detokenizer:
    """The text of token ids, as `tokenizers`' `decode` gives it with the special tokens kept,
    for a tokenizer whose decoder is `ByteLevel`."""

    def __new__(cls, tokenizer_json: str) -> Detokenizer:
        """Raises `TokenizerError` for a tokenizer.json that does not load or whose decoder is
        not `ByteLevel`, saying why."""
    def decode(self, ids: _TokenIds) -> str:
        """The text of `ids` (a list of ints or an integer array)."""
    def __len__(self) -> int:
        """How many ids the table holds (one past the largest id with a token)."""

@final
class BodyIndex:
    """Where a request body's top-level fields and its array field's elements lie (bytes)."""

    @property
    def fields(self) -> list[tuple[str, int, int]]:
        """`(key, start, end)` of each top-level field, in body order."""
    @property
    def array_field(self) -> int | None:
        """The position in `fields` of the array field; None when the body has no such array."""
    @property
    def elements(self) -> list[tuple[int, int]]:
        """`(start, end)` of each element of the array field."""
    def elements_from(self, start: int) -> list[tuple[int, int]]:
        """`(start, end)` of each element of the array field from the `start`-th on."""
    @property
    def depth(self) -> int:
        """The deepest nesting of objects and arrays; the body itself is 1."""
    @property
    def structural(self) -> int:
        """Separators and openings outside strings: how many values the body holds."""
    @property
    def surrogate_escape(self) -> bool:
        """Whether a string holds a `\\uD800`..`\\uDFFF` escape."""
    def __len__(self) -> int: ...

def index_body(
    body: bytes, array: str, previous: tuple[bytes, BodyIndex] | None = None
) -> BodyIndex:
    """Index `body`; `array` names the field whose elements get spans. `previous`: the
    session's previous body and its index, taken for the bytes both share (the same result
    as without it). Raises `BodyShapeError` when the index does not take the body (the
    caller parses it whole)."""

def diff_bodies(
    old_body: bytes, old: BodyIndex, new_body: bytes, new: BodyIndex
) -> tuple[list[int], int]:
    """The positions in `new.fields` whose values differ from `old`'s, and the first element
    of the array that differs."""

def number_array(
    text: bytes,
) -> tuple[int, list[int | float | bool | None], list[type | None]] | None:
    """`(width, values, types)` of the JSON array whose text between its brackets is `text`:
    width 0 for an array of scalars, else rows of `width` scalars each, their values flat;
    `types`: the one type of every value of each column (of the array, for scalars), None
    where they differ. None when it is anything else (a string, a nested array, unequal rows,
    `NaN`, an integer past 64 bits, broken syntax): the caller parses it itself. Parsed with
    the GIL released."""

def sglang_run(body: bytes, have: int) -> tuple[list[int], list[float]] | None:
    """`(ids, logprobs)` of the run of SGLang stream events whose bytes are `body` (`data: ` +
    the events joined by `\\n\\ndata: ` + `\\n\\n`), after `have` tokens taken, or None
    where an event is not of the plain shape (`rust/sglang_run.rs`) or the counts do not add
    up. An entry's text is checked, not kept. Parsed with the GIL released."""

def sse_run(buf: bytes, max_event: int) -> tuple[int, int, bool] | None:
    """`(end, events, done)` where `buf[:end]` is a run of complete single-line `data: ` events
    (no comment, other field or CR) holding `events` of them, none and not what follows them
    over `max_event` bytes, and `done` where a `[DONE]` event ends it; None where `buf` is not
    of that shape."""

def http_chunks(buf: bytes, left: int) -> tuple[bytes, int, int, bool]:
    """`(body, end, left, last)` of the read `buf` of a body in chunked transfer coding,
    `left` bytes into the current chunk (its data and CRLF still to come; 0 at a size line):
    the chunks' data joined, the bytes taken (the rest starts a size line or the trailers, for
    the next read), the bytes of the current chunk still to come, and whether the last chunk
    and its trailers ended the body (`rust/http_chunks.rs`). Raises `ChunkedBodyError` for
    broken framing."""
