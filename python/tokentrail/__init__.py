"""tokentrail: turn agent sessions into loss-masked training samples without losing a token."""

from __future__ import annotations

from tokentrail.errors import (
    ExportError,
    LogprobLengthError,
    MessageError,
    PackError,
    PolicyError,
    RequestError,
    SessionError,
    TemplateError,
    TokenIdError,
    TokenizerError,
    TokentrailError,
)
from tokentrail.kinds import (
    DriftKind,
    DriftPolicy,
    Fallback,
    History,
    MaskReason,
    Restore,
    Retry,
    RewritePolicy,
    Stage,
)
from tokentrail.messages import Conversation, Message, ToolCall, ToolSchema
from tokentrail.storage.export import PackedBatch, pack_samples, read_samples, write_samples
from tokentrail.text.chat_template import render
from tokentrail.text.incremental import IncrementalEncoder
from tokentrail.text.parsing import ParsedOutput, format_output, parse_output
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer
from tokentrail.trajectory.ledger import Ledger, TurnLedger
from tokentrail.trajectory.manager import DriftRecord, Trajectory, TrajectoryManager
from tokentrail.trajectory.pipeline import PreparedTurn, TurnPipeline
from tokentrail.trajectory.sample import Sample
from tokentrail.trajectory.turn import TurnRecord

__version__ = "0.1.0"

__all__ = [
    "Conversation",
    "DriftKind",
    "DriftPolicy",
    "DriftRecord",
    "ExportError",
    "Fallback",
    "History",
    "IncrementalEncoder",
    "Ledger",
    "LoadedTokenizer",
    "LogprobLengthError",
    "MaskReason",
    "Message",
    "MessageError",
    "PackError",
    "PackedBatch",
    "ParsedOutput",
    "PolicyError",
    "PreparedTurn",
    "RequestError",
    "Restore",
    "Retry",
    "RewritePolicy",
    "Sample",
    "SessionError",
    "Stage",
    "TemplateError",
    "TokenIdError",
    "TokenizerError",
    "TokentrailError",
    "ToolCall",
    "ToolSchema",
    "Trajectory",
    "TrajectoryManager",
    "TurnLedger",
    "TurnPipeline",
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
