"""The adapter's settings, one dataclass that `tokentrail serve` fills from its flags, and a
session's own (`SessionSettings`), which a trainer opens a session with."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tokentrail.adapter.access_log import AccessLog
from tokentrail.adapter.limits import Limits
from tokentrail.adapter.offload import DEFAULT_WORKERS
from tokentrail.adapter.protocols.common import KEEPALIVE_S
from tokentrail.adapter.protocols.options import DEFAULT_WIRE, WireOptions
from tokentrail.kinds import History, Restore, Retry, parse_kind
from tokentrail.text.render_budget import DEFAULT_RENDER_BUDGET_S
from tokentrail.text.vision import ImageLimits
from tokentrail.trajectory.side import KNOWN_SIDE_REQUESTS, SideRules


@dataclass
class AdapterConfig:
    model_name: str = "tokentrail"
    # Output formats by name; "auto": the model family's (see `TurnPipeline`); None: off.
    tool_parser: str | None = "auto"
    reasoning_parser: str | None = "auto"
    max_turns_per_session: int = 0
    # The rollout's context budget: a prompt over it is refused with the API's "prompt is too
    # long" (so a harness compacts); 0: no budget beyond the model's context length.
    max_context_tokens: int = 0
    # Admin routes (finish, drop) over HTTP need this token; None: they are off over HTTP.
    admin_token: str | None = None
    # Let OpenAI bodies (`metadata.session_id`, `user`) name the session instead of the key.
    session_from_body: bool = False
    # Where the protocols read or write the wire as slime's adapters do (slime's drop-in sets
    # them); tokentrail's reading by default.
    wire: WireOptions = DEFAULT_WIRE
    limits: Limits = field(default_factory=Limits)
    # Decoded bytes and pixels of one image and of all of a request's images (400 past them).
    image_limits: ImageLimits = field(default_factory=ImageLimits)
    # Threads for CPU-heavy steps; 0: every step inline on the event loop.
    workers: int = DEFAULT_WORKERS
    # Open sessions at most (0: no cap); sessions idle this long are evicted (0: never).
    max_sessions: int = 10_000
    # Resident bytes the adapter admits work up to (`adapter.memory`); 0: half the machine's.
    max_memory: int = 0
    session_idle_ttl_s: float = 3 * 3600.0
    # How long a finished session's samples stay to answer a repeated finish.
    finish_retention_s: float = 300.0
    restore: Restore = Restore.ON
    # Restore an echo whose tool calls carry the ids we minted (and name the same tools),
    # whatever the harness did to their arguments; off: the coarse comparison alone.
    restore_by_id: bool = True
    history: History = History.SPLICE
    # What a retried request gets (a session's own rule and the request's header come first).
    retry: Retry = Retry.REPLAY
    # Check a spliced tail against the full render every this many splices (1: every turn).
    splice_verify_every: int = 8
    # Seconds one render of a request's prompt may run before it is stopped and the request
    # refused (`text.render_budget`; 0: no bound).
    render_budget_s: float = DEFAULT_RENDER_BUDGET_S
    default_max_tokens: int = 4096
    # Warn once per finished session whose tool-call turns lost more than this share.
    masked_warning_threshold: float = 0.05
    # Side conversations excluded from training in every session: regular expressions searched
    # in a conversation's first message; `exclude_known_side_requests` adds
    # `side.KNOWN_SIDE_REQUESTS` (the side requests of Qwen Code, hermes-agent, opencode/kilo
    # and Claude Code), each excluded under its rule's name.
    exclude_patterns: tuple[str, ...] = ()
    exclude_known_side_requests: bool = False
    # Ask the engine for every turn's MoE routed experts / sparse-attention indexer top-k
    # (off by default); the manager's shapes check what comes back and size the store.
    routed_experts: bool = False
    indexer_topk: bool = False
    # Sessions (the most recent) whose latest request is kept, so that their next request is
    # parsed and translated only where it differs (`adapter.reuse`); 0: every request in full.
    request_memo: int = 256
    # Translate every request both ways, resumed and in full, count the two as the same or
    # not (`tokentrail_resume_checks_total`) and warn on a mismatch; a debugging aid, off.
    verify_resume: bool = False
    # Refuse turns for sessions not opened with `open_session` (an adapter behind a pool).
    open_sessions_only: bool = False
    # Stream replies as they are sampled (`serve --engine-stream`), tokens captured from the
    # engine's own stream; a keepalive whenever nothing else went out for `keepalive_s`.
    live_stream: bool = False
    keepalive_s: float = KEEPALIVE_S
    # One line per request (`serve --access-log`); None: off.
    access_log: AccessLog | None = None

    def side_rules(self) -> SideRules:
        known = KNOWN_SIDE_REQUESTS if self.exclude_known_side_requests else ()
        return SideRules.compile(self.exclude_patterns, known)


@dataclass(frozen=True)
class SessionSettings:
    """What a session opened by a trainer sets for itself: `sampling_defaults` fill what a
    request leaves out, `max_context_tokens` is its context budget (0: the adapter's), `history`
    and `retry` override the adapter's, `exclude_patterns` exclude its side conversations from
    training (beside the adapter's own patterns), `group` is the group its samples belong to
    (`metadata["group"]`, for `pack_tree`). One value from the pool to the actor, the adapter,
    its sessions and the journal."""

    sampling_defaults: Mapping[str, Any] = field(default_factory=dict)
    max_context_tokens: int = 0
    history: History | None = None
    exclude_patterns: tuple[str, ...] = ()
    retry: Retry | None = None
    group: str | None = None

    def __post_init__(self) -> None:
        # Strings and lists as a caller (or the journal) gives them, held as the types above.
        set_ = object.__setattr__
        set_(self, "sampling_defaults", dict(self.sampling_defaults or {}))
        set_(self, "max_context_tokens", int(self.max_context_tokens))
        if self.history is not None:
            set_(self, "history", parse_kind(History, self.history, "history mode"))
        set_(self, "exclude_patterns", tuple(self.exclude_patterns or ()))
        if self.retry is not None:
            set_(self, "retry", parse_kind(Retry, self.retry, "retry mode"))

    def journaled(self) -> dict[str, Any]:
        """The settings as the journal's `open` event holds them."""
        out: dict[str, Any] = {
            "sampling_defaults": dict(self.sampling_defaults),
            "max_context_tokens": self.max_context_tokens,
            "history": None if self.history is None else str(self.history),
            "retry": None if self.retry is None else str(self.retry),
        }
        if self.exclude_patterns:
            out["exclude_patterns"] = list(self.exclude_patterns)
        if self.group is not None:
            out["group"] = self.group
        return out

    @classmethod
    def from_journal(cls, data: Mapping[str, Any]) -> SessionSettings:
        """The settings of a journal's `open` event (`journaled` read back)."""
        patterns: Iterable[str] = data.get("exclude_patterns") or ()
        return cls(
            data.get("sampling_defaults") or {},
            data.get("max_context_tokens", 0),
            data.get("history"),
            tuple(patterns),
            data.get("retry"),
            data.get("group"),
        )
