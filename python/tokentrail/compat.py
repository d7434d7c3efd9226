"""What Python 3.10 lacks that tokentrail uses, in one place: `StrEnum`, `tomllib`,
`Task.cancelling()`.

On 3.11 and later these are the standard library's own; on 3.10 a `StrEnum` with the same
`str()` and `format()` (the member's value), `tomli` (the package `tomllib` came from), and no
count of pending cancellations.
"""

from __future__ import annotations

import asyncio
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


__all__ = ["StrEnum", "cancelling", "tomllib"]
