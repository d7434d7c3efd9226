"""Every exception tokentrail raises, in one module, under one root: `TokentrailError`.

Each one carries the HTTP status and error type the adapter answers with when it reaches a
harness; the adapter's one error middleware (`tokentrail.adapter.http.middleware`) reads them and
writes each protocol's JSON error body. Bad input is an `InvalidInput` (a `ValueError`), named
for what is wrong: a 4xx. An `EngineError` is not bad input: the engine failed, and the harness
gets a 502.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class TokentrailError(Exception):
    """Root of every error tokentrail raises."""

    # What the adapter answers when this reaches a harness.
    status = 500
    kind = "api_error"


class InvalidInput(TokentrailError, ValueError):
    """Base of every error tokentrail raises for bad input: a 400 unless a subclass says."""

    status = 400
    kind = "invalid_request_error"


class UnknownName(InvalidInput):
    """A name that is not one of a closed set's (`tokentrail.kinds.parse_kind`); the message
    names the allowed values."""


# -- the hot path ---------------------------------------------------------------------------------


class TokenIdError(InvalidInput):
    """A token id is negative, not an integer, or does not fit in 32 bits."""


class LogprobLengthError(InvalidInput):
    """A turn's logprobs do not match its output tokens one for one."""


class LogprobAssertionError(LogprobLengthError, AssertionError):
    """`LogprobLengthError` as slime's `TrajectoryManager` raises it: also an `AssertionError`
    (slime asserts the lengths match), so code that catches slime's keeps working."""


class PolicyError(InvalidInput):
    """An unknown policy or an out-of-range setting, or a call the policy forbids."""


class PackError(InvalidInput):
    """Samples cannot be packed: a mask or logprobs does not fit the response, a response is
    longer than its sample, or the inputs differ in number."""


class TreeError(InvalidInput):
    """Samples cannot be laid out as a prefix tree (replay rows some samples carry and others
    not, or of two shapes), or a tree asked for a mask it cannot give (too many tokens for a
    dense mask, no flex attention in this torch)."""


class BodyShapeError(InvalidInput):
    """A request body the core's index does not take (broken structure, a top-level key with
    escapes or given twice): the adapter then parses it whole, and that parse names what is
    wrong, if anything is."""


class ReplayError(InvalidInput):
    """Replay data (MoE routed experts, indexer top-k) that does not fit: rows of another
    shape than the model's, a value out of range, rows for a store kept without that tape."""


# -- messages, text, templates ------------------------------------------------------------------


class MessageError(InvalidInput):
    """A message list or a message is malformed (not a list, no role, wrong types)."""


class TokenizerError(InvalidInput):
    """A tokenizer spec cannot be loaded, or a token does not exist in the vocabulary."""


class TemplateError(InvalidInput):
    """A chat template failed: bad syntax, or it rejected the messages (`raise_exception`)."""


class TemplateBudgetExceeded(TemplateError):
    """A chat template's startup renders ran past the CPU or memory budget
    (`text.template_check`): it is refused before the server renders it."""


class RenderBudgetExceeded(TemplateError):
    """A chat template ran past the per-request render budget (`text.render_budget`): it
    loops on something in this request. Refused like a request the template rejects (a 400
    in the protocol's shape, not retried by the SDKs, so it does not spin again); nothing of
    it was generated or recorded."""


class OutputFormatError(InvalidInput):
    """An unknown parser or format name, or a message `format_output` cannot write."""


# -- sessions and storage -------------------------------------------------------------------------


class SessionError(InvalidInput):
    """An operation names a session that does not exist or is closed."""

    status = 404
    kind = "not_found_error"


class JournalError(InvalidInput):
    """A journal cannot be opened or written."""


class ExportError(InvalidInput):
    """A sample file cannot be written or read: unknown format, missing pyarrow, corrupt file."""


# -- engines --------------------------------------------------------------------------------------


class EngineSpecError(InvalidInput):
    """An engine spec string `create_engine` does not understand."""


class SamplingParamsError(InvalidInput):
    """A sampling override names an unknown parameter or has the wrong type."""


class ScriptError(InvalidInput):
    """A scripted engine's script is malformed."""


class ModelError(InvalidInput):
    """An in-process model cannot be built or loaded (unknown tiny model, unreadable directory,
    torch or transformers missing), or a sample does not fit it."""


class EngineError(TokentrailError):
    """The engine failed a request: unreachable, non-2xx, or an answer that cannot be read.

    `engine_status` is the engine's HTTP status when it sent one. The adapter answers the
    harness with HTTP 502 and this message.
    """

    status = 502
    kind = "api_error"

    def __init__(self, message: str, engine_status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.engine_status = engine_status

    def __str__(self) -> str:
        if self.engine_status is None:
            return self.message
        return f"{self.message} (HTTP {self.engine_status})"


class EngineRefusedRequest(EngineError):
    """The engine answered that the request is wrong (HTTP 400, 413 or 422): a prompt over its
    served context, a parameter out of its range. The harness gets the protocol's 400 with the
    engine's own message, which an SDK does not retry and a harness can act on (compact its
    context), not the 502 of an engine that failed."""


# The engine statuses that mean "the request is wrong", not "the engine failed".
ENGINE_REFUSALS = frozenset({400, 413, 422})


def engine_error(message: str, engine_status: int | None) -> EngineError:
    """The error for an engine's non-2xx answer: `EngineRefusedRequest` for a refusal of the
    request itself (`ENGINE_REFUSALS`), else `EngineError`."""
    if engine_status in ENGINE_REFUSALS:
        return EngineRefusedRequest(message, engine_status)
    return EngineError(message, engine_status)


class ChunkedBodyError(EngineError):
    """An engine's chunked response body whose framing is broken (a chunk size that is not a
    hex number, data not followed by CRLF): raised by the core's `http_chunks`; the engine
    client says which engine and URL."""


class EngineOutputError(EngineError):
    """The engine answered, but with output that cannot be trained on: a token id outside the
    vocabulary, a logprob that is not a finite number <= 0, logprobs and tokens that differ in
    number, more tokens than asked for, no tokens, or an unknown finish reason.

    `fault` names which (`tokentrail.kinds.EngineFault`); the adapter counts it in `/metrics`.
    """

    def __init__(self, fault: str, message: str) -> None:
        super().__init__(message)
        self.fault = fault


# -- what a harness's request can be refused for ----------------------------------------------


class RequestError(InvalidInput):
    """A harness's request is malformed; the adapter answers it with HTTP 400."""


class ImageError(RequestError):
    """An image in a request that a vision model cannot take: it does not decode, its type is
    not one the processor reads, it is a remote URL (the adapter fetches nothing), or it is past
    the per-image or per-request limits."""


class AuthenticationError(InvalidInput):
    """A request carries no usable credential (the session id is the API key)."""

    status = 401
    kind = "authentication_error"


class PermissionDenied(InvalidInput):
    """A credential that may not do this (an admin route without the admin token)."""

    status = 403
    kind = "permission_error"


class NotFound(InvalidInput):
    """An unknown route or resource."""

    status = 404
    kind = "not_found_error"


class ContextTooLong(InvalidInput):
    """A prompt over the session's context window: refused before generating, in words both
    SDK families' harnesses recognise ("prompt is too long", "maximum context length"), so
    they compact and retry instead of reading an empty reply."""


class EngineLimit(InvalidInput):
    """A request asks for something the engine cannot do (a forced tool choice on an engine
    without structured output): refused before anything is generated."""


class SessionClosed(InvalidInput):
    """A turn for a session that was finished or dropped: retrying cannot help, so the status
    is one the official SDKs do not retry (they retry 408, 409, 429 and 5xx)."""

    status = 410
    kind = "invalid_request_error"


class SessionDamaged(InvalidInput):
    """A finish of a session that lost journaled turns (a crash, a damaged journal) before it
    was linearized, asked without `accept_lost`: never answered as if the session had generated
    only what is left. `lost` says what is gone (turns, events, and each span with its reason
    and first event), `ledger` is the ledger of what is left; a finish with `accept_lost` gets
    the samples, with the same loss stated in the ledger and in every sample's metadata."""

    status = 409
    kind = "session_damaged"

    def __init__(
        self, sid: str, message: str, lost: Mapping[str, object], ledger: Mapping[str, object]
    ):
        super().__init__(message)
        self.sid = sid
        self.lost = lost
        self.ledger = ledger

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.sid, str(self), self.lost, self.ledger)


class RequestTimeout(InvalidInput):
    """A request's body did not arrive in full within the adapter's read timeout."""

    status = 408
    kind = "timeout_error"


class BodyCutShort(RequestError):
    """The client closed its sending side before the body its Content-Length announced was
    complete: nothing more can arrive, so it is refused at once."""

    def __init__(self, received: int, announced: int | None = None) -> None:
        of = f" of the {announced} its Content-Length announced" if announced else ""
        super().__init__(
            f"the request body ended after {received} bytes{of}: the client closed its "
            "sending side (shutdown) before the body was complete"
        )


class RequestTooLarge(InvalidInput):
    """A body, or a part of it, over the adapter's admission limits."""

    status = 413
    kind = "request_too_large"


class RateLimited(InvalidInput):
    """A per-session or server-wide limit that a later retry may pass."""

    status = 429
    kind = "rate_limit_error"


class Overloaded(TokentrailError):
    """A server-wide limit that frees up as other work finishes (concurrent turns, open
    sessions, connections): HTTP 503 with `Retry-After`, since a retry can succeed."""

    status = 503
    kind = "overloaded_error"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OverMemory(Overloaded):
    """The adapter's memory budget (`--max-memory`) has no room for this request: answered in
    each API's own words for "busy, retry" (OpenAI's 429 `rate_limit_error`, Anthropic's 529
    `overloaded_error`), with `Retry-After`; the official SDKs retry both. Not bad input: a
    server-wide limit, a 503 on any other path."""

    # What each protocol (by name) answers with instead of the 503 of `Overloaded`.
    by_protocol = {
        "anthropic": (529, "overloaded_error"),
        "openai": (429, "rate_limit_error"),
        "responses": (429, "rate_limit_error"),
    }


class UpstreamError(TokentrailError):
    """What the harness reads when the engine failed its turn (HTTP 502); nothing is recorded."""

    status = 502
    kind = "api_error"


# -- the adapter pool (tokentrail.scale) ----------------------------------------------------------


class PoolError(InvalidInput):
    """An adapter pool cannot be placed or used as asked: no node fits, an unknown session."""


class SessionLost(InvalidInput):
    """A pool cannot deliver a session's samples; `reason` (a `LostReason`) says why.

    Never an empty result in its place: the trainer learns which session's signal is gone.
    """

    status = 410
    kind = "invalid_request_error"

    def __init__(
        self, sid: str, reason: str, detail: str = "", lost: Mapping[str, object] | None = None
    ) -> None:
        self.sid = sid
        self.reason = reason
        self.detail = detail
        # What of it is gone, where the journal says (`LostReason.JOURNAL_DAMAGED`): turns,
        # events and each span, as a finish answer's `lost` states them.
        self.lost = lost
        super().__init__(f"session {sid!r} lost ({reason}){': ' + detail if detail else ''}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.sid, self.reason, self.detail, self.lost)


# -- the command line ------------------------------------------------------------------------------


class SettingError(InvalidInput):
    """A `tokentrail serve` setting (a flag, a `--config` file key or a `TOKENTRAIL_*` variable)
    is unknown or has a value it cannot take; the message names the setting and the value."""


# -- trainer integrations -------------------------------------------------------------------------


class HarnessFailed(TokentrailError):
    """A harness run by a trainer integration failed (a command that exited non-zero or ran
    past its time, a prompt with no task in it); its session is dropped, never trained."""
