"""tokentrail: turn agent sessions into loss-masked training samples without losing a token."""

from __future__ import annotations

from tokentrail.chat_template import TemplateError, render
from tokentrail.errors import (
    ExportError,
    LogprobLengthError,
    MessageError,
    PackError,
    PolicyError,
    SessionError,
    TokenIdError,
    TokentrailError,
)
from tokentrail.export import PackedBatch, pack_samples, read_samples, write_samples
from tokentrail.incremental import IncrementalEncoder
from tokentrail.ledger import Ledger, TurnLedger
from tokentrail.manager import DriftRecord, Trajectory, TrajectoryManager
from tokentrail.parsing import ParsedOutput, format_output, parse_output
from tokentrail.pipeline import Restore
from tokentrail.sample import Sample
from tokentrail.tokenizer import LoadedTokenizer, TokenizerError, load_tokenizer
from tokentrail.turn import TurnRecord

__version__ = "0.1.0"

__all__ = [
    "DriftRecord",
    "ExportError",
    "IncrementalEncoder",
    "Ledger",
    "LoadedTokenizer",
    "LogprobLengthError",
    "MessageError",
    "PackError",
    "ParsedOutput",
    "PolicyError",
    "Restore",
    "PackedBatch",
    "Sample",
    "SessionError",
    "TemplateError",
    "TokenIdError",
    "TokenizerError",
    "TokentrailError",
    "Trajectory",
    "TrajectoryManager",
    "TurnLedger",
    "TurnRecord",
    "__version__",
    "format_output",
    "load_tokenizer",
    "pack_samples",
    "parse_output",
    "read_samples",
    "render",
    "write_samples",
]
