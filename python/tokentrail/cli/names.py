"""The values of a closed set, as a flag's choices."""

from __future__ import annotations

from enum import Enum


def names(enum: type[Enum]) -> list[str]:
    return [str(member.value) for member in enum]
