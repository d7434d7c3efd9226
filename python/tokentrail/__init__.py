"""tokentrail: turn agent sessions into loss-masked training samples without losing a token."""

from __future__ import annotations

from tokentrail.errors import (
    LogprobLengthError,
    MessageError,
    PolicyError,
    SessionError,
    TokenIdError,
    TokentrailError,
)
from tokentrail.ledger import Ledger, TurnLedger
from tokentrail.manager import DriftRecord, Trajectory, TrajectoryManager
from tokentrail.sample import Sample
from tokentrail.turn import TurnRecord

__version__ = "0.1.0"

__all__ = [
    "DriftRecord",
    "Ledger",
    "LogprobLengthError",
    "MessageError",
    "PolicyError",
    "Sample",
    "SessionError",
    "TokenIdError",
    "TokentrailError",
    "Trajectory",
    "TrajectoryManager",
    "TurnLedger",
    "TurnRecord",
    "__version__",
]
