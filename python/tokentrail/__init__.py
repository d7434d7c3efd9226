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
    TemplateBudgetExceeded,
    TemplateError,
    TokenIdError,
    TokenizerError,
    TokentrailError,
    TreeError,
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
    TreeMask,
)
from tokentrail.messages import Conversation, Message, ToolCall, ToolSchema
from tokentrail.storage.export import PackedBatch, pack_samples, read_samples, write_samples
from tokentrail.storage.tree_pack import TreePack, pack_tree, read_tree_pack, write_tree_pack
from tokentrail.text.chat_template import ChatTemplate, render
from tokentrail.text.families import Family, families, family
from tokentrail.text.incremental import IncrementalEncoder
from tokentrail.text.parsing import ParsedOutput, format_output, parse_output
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer
from tokentrail.trajectory.layout_stats import TreeStats
from tokentrail.trajectory.ledger import Ledger, TurnLedger
from tokentrail.trajectory.linearize import DriftRecord, Trajectory
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.pipeline import PreparedTurn, TurnPipeline
from tokentrail.trajectory.prefix_tree import PrefixTree, build_prefix_tree
from tokentrail.trajectory.sample import Sample
from tokentrail.trajectory.turn import TurnRecord


def __getattr__(name: str) -> str:
    # Cargo.toml holds the version and the extension carries it, read when asked for so that
    # `TOKENTRAIL_BACKEND=python` runs without importing the extension.
    if name == "__version__":
        from tokentrail import _core

        return _core.__version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "PrefixTree",
    "PreparedTurn",
    "RequestError",
    "Restore",
    "Retry",
    "RewritePolicy",
    "Sample",
    "SessionError",
    "Stage",
    "TemplateBudgetExceeded",
    "TemplateError",
    "TokenIdError",
    "TokenizerError",
    "TokentrailError",
    "ToolCall",
    "ToolSchema",
    "Trajectory",
    "TrajectoryManager",
    "TreeError",
    "TreeMask",
    "TreePack",
    "TreeStats",
    "TurnLedger",
    "TurnPipeline",
    "TurnRecord",
    "UnknownName",
    "__version__",
    "build_prefix_tree",
    "families",
    "family",
    "format_output",
    "load_tokenizer",
    "pack_samples",
    "pack_tree",
    "parse_output",
    "read_samples",
    "read_tree_pack",
    "render",
    "write_samples",
    "write_tree_pack",
]
