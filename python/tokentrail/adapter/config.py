"""The adapter's settings, one dataclass that `tokentrail serve` fills from its flags."""

from __future__ import annotations

from dataclasses import dataclass

from tokentrail.kinds import History, Restore
from tokentrail.trajectory.side import KNOWN_SIDE_PROMPTS

DEFAULT_MAX_BODY = 64 * 1024 * 1024


@dataclass
class AdapterConfig:
    model_name: str = "tokentrail"
    # Output formats by name; "auto": the model family's (see `TurnPipeline`); None: off.
    tool_parser: str | None = "auto"
    reasoning_parser: str | None = "auto"
    max_turns_per_session: int = 0
    max_context_tokens: int = 0
    admin_token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY
    restore: Restore = Restore.ON
    history: History = History.SPLICE
    # Check a spliced tail against the full render every this many splices (1: every turn).
    splice_verify_every: int = 8
    default_max_tokens: int = 4096
    # Warn once per finished session whose tool-call turns lost more than this share.
    masked_warning_threshold: float = 0.05
    # Side conversations excluded from training in every session: regular expressions searched
    # in a conversation's first message; `exclude_known_side_requests` adds
    # `side.KNOWN_SIDE_PROMPTS` (the side requests of Qwen Code and hermes-agent).
    exclude_patterns: tuple[str, ...] = ()
    exclude_known_side_requests: bool = False
    # Ask the engine for every turn's MoE routed experts / sparse-attention indexer top-k
    # (off by default); the manager's shapes check what comes back and size the store.
    routed_experts: bool = False
    indexer_topk: bool = False

    def side_patterns(self) -> list[str]:
        known = list(KNOWN_SIDE_PROMPTS.values()) if self.exclude_known_side_requests else []
        return [*self.exclude_patterns, *known]
