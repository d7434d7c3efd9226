"""The exceptions tokentrail raises. Each one is a `ValueError`: bad input, named."""

from __future__ import annotations


class TokentrailError(ValueError):
    """Base of every error tokentrail raises for bad input."""


class TokenIdError(TokentrailError):
    """A token id is negative, not an integer, or does not fit in 32 bits."""


class LogprobLengthError(TokentrailError):
    """A turn's logprobs do not match its output tokens one for one."""


class PolicyError(TokentrailError):
    """An unknown policy or an out-of-range setting, or a call the policy forbids."""


class MessageError(TokentrailError):
    """A message list or a message is malformed (not a list, no role, wrong types)."""


class SessionError(TokentrailError):
    """An operation names a session that does not exist or is closed."""


class RequestError(TokentrailError):
    """A harness's request is malformed; the adapter answers it with HTTP 400."""


class ExportError(TokentrailError):
    """A sample file cannot be written or read: unknown format, missing pyarrow, corrupt file."""


class PackError(TokentrailError):
    """Samples cannot be packed: a mask or logprobs does not fit the response, a response is
    longer than its sample, or the inputs differ in number."""
