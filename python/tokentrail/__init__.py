"""tokentrail: turn agent sessions into loss-masked training samples without losing a token."""

from __future__ import annotations

from tokentrail.errors import (
    EngineError,
    ExportError,
    InvalidInput,
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
    UnknownName,
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
from tokentrail.text.chat_template import ChatTemplate, render
from tokentrail.text.families import Family, families, family
from tokentrail.text.incremental import IncrementalEncoder
from tokentrail.text.parsing import ParsedOutput, format_output, parse_output
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer
from tokentrail.trajectory.ledger import Ledger, TurnLedger
from tokentrail.trajectory.linearize import DriftRecord, Trajectory
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.pipeline import PreparedTurn, TurnPipeline
from tokentrail.trajectory.sample import Sample
from tokentrail.trajectory.turn import TurnRecord

__version__ = "0.1.0"

__all__ = [
    "ChatTemplate",
    "Conversation",
    "DriftKind",
    "DriftPolicy",
    "DriftRecord",
    "EngineError",
    "ExportError",
    "Fallback",
    "Family",
    "History",
    "InvalidInput",
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
    "UnknownName",
    "__version__",
    "families",
    "family",
    "format_output",
    "load_tokenizer",
    "pack_samples",
    "parse_output",
    "read_samples",
    "render",
    "write_samples",
]
