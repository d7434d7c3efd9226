"""What Python 3.10 lacks that tokentrail uses, in one place: `StrEnum`, `tomllib`,
`Task.cancelling()`, strict base64 decoding.

On 3.11 and later these are the standard library's own; on 3.10 a `StrEnum` with the same
`str()` and `format()` (the member's value), `tomli` (the package `tomllib` came from), no
count of pending cancellations, and base64 checked against its alphabet before decoding.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import sys
from enum import Enum
from typing import Any

if sys.version_info >= (3, 11):
    from enum import StrEnum

    import tomllib
else:  # pragma: no cover - exercised by the 3.10 run
    import tomli as tomllib

    class StrEnum(str, Enum):
        """An enum whose members are strings and print as their values, as 3.11's does."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)


def cancelling(task: asyncio.Task[Any] | None) -> int:
    """How many cancellations of `task` are pending (`Task.cancelling()`); 0 on 3.10, which
    does not count them: there a caller's cancellation that meets an engine abort reads as
    the abort."""
    if task is None:
        return 0
    if sys.version_info >= (3, 11):
        return task.cancelling()
    return 0  # pragma: no cover - exercised by the 3.10 run


def a2b_base64_strict(data: Any) -> bytes:
    """`binascii.a2b_base64(data, strict_mode=True)`: raises `binascii.Error` on any character
    outside the alphabet, padding that is not at the end, or a length that is not whole."""
    if sys.version_info >= (3, 11):
        return binascii.a2b_base64(data, strict_mode=True)
    if isinstance(data, memoryview):  # pragma: no cover - exercised by the 3.10 run
        data = data.tobytes()
    return base64.b64decode(data, validate=True)


__all__ = ["StrEnum", "a2b_base64_strict", "cancelling", "tomllib"]
