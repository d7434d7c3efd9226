"""The adapter's settings, one dataclass that `tokentrail serve` fills from its flags, and a
session's own (`SessionSettings`), which a trainer opens a session with."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tokentrail.adapter.http.access_log import AccessLog
from tokentrail.adapter.offload import DEFAULT_WORKERS
from tokentrail.adapter.protocols.options import DEFAULT_WIRE, WireOptions
from tokentrail.adapter.protocols.sse import KEEPALIVE_S
from tokentrail.adapter.request.limits import Limits
from tokentrail.kinds import History, Restore, Retry, SettingGroup, parse_kind
from tokentrail.setting import MAX_SECONDS, MAX_WORKERS, internal, section, setting
from tokentrail.text.render_budget import DEFAULT_RENDER_BUDGET_S
from tokentrail.text.vision import ImageLimits
from tokentrail.trajectory.side import KNOWN_SIDE_REQUESTS, SideRules

SERVER, ENGINE, HISTORY = SettingGroup.SERVER, SettingGroup.ENGINE, SettingGroup.HISTORY
SESSIONS, REPLAY, STREAMING = SettingGroup.SESSIONS, SettingGroup.REPLAY, SettingGroup.STREAMING


def _tool_parsers() -> list[str]:
    from tokentrail.text.formats import tool_format_names

    return ["auto", "none", *tool_format_names()]


def _reasoning_parsers() -> list[str]:
    from tokentrail.text.formats import reasoning_format_names

    return ["auto", "none", *reasoning_format_names()]


@dataclass
class AdapterConfig:
    """The adapter's settings; those made with `setting(...)` are `tokentrail serve`'s too."""

    # -- server
    # Admin routes (finish, drop) over HTTP need this token; None: they are off over HTTP.
    admin_token: str | None = setting(
        None, SERVER, "token the admin routes (finish, drop) need; unset: they are off over HTTP",
        default_text="unset", secret=True,
    )  # fmt: skip
    workers: int = setting(
        DEFAULT_WORKERS, SERVER, "threads for CPU-heavy steps; 0: on the event loop",
        # The machine's: the settings reference is the same wherever it is written.
        default_text="one per core, up to 4", bounds=(0, MAX_WORKERS),
    )  # fmt: skip
    # -- engine and model
    # Output formats by name; "auto": the model family's (see `TurnPipeline`); None or
    # "none": off.
    tool_parser: str | None = setting(
        "auto", ENGINE, "tool-call format; auto: the model family's", choices=_tool_parsers
    )
    reasoning_parser: str | None = setting(
        "auto", ENGINE, "reasoning format; auto: the model family's", choices=_reasoning_parsers
    )
    model_name: str = setting("tokentrail", ENGINE, "the model name replies carry")
    # -- history and splicing
    history: History = setting(
        History.SPLICE, HISTORY,
        "how a turn's prompt ids are built: splice a tail or render all",
    )  # fmt: skip
    # Check a spliced tail against the full render every this many splices (1: every turn).
    splice_verify_every: int = setting(
        8, HISTORY,
        "check a spliced tail against the full render every N splices (after the reply, the "
        "period doubling to 64 while checks pass); 1: every turn, before the reply",
        unit="splices",
    )  # fmt: skip
    # Seconds one render of a request's prompt may run before it is stopped and the request
    # refused (`text.render_budget`; 0: no bound).
    render_budget_s: float = setting(
        DEFAULT_RENDER_BUDGET_S, HISTORY, "how long one render of a request's prompt may run (a "
        "template that loops on some input): a 400 after; 0: no bound", unit="s",
        bounds=(0, MAX_SECONDS), name="render_budget",
    )  # fmt: skip
    # Sessions (the most recent) whose latest request is kept, so that their next request is
    # parsed and translated only where it differs (`adapter.request.memo`); 0: every request
    # in full.
    request_memo: int = setting(
        256, HISTORY,
        "sessions whose latest request is kept, so the next is parsed only where it differs; "
        "0: every request in full",
        unit="sessions",
    )  # fmt: skip
    # Translate every request both ways, resumed and in full, count the two as the same or
    # not (`tokentrail_resume_checks_total`) and warn on a mismatch; a debugging aid, off.
    verify_resume: bool = setting(
        False, HISTORY,
        "debugging: translate every request both resumed (--request-memo) and in full, count "
        "them in tokentrail_resume_checks_total and warn when they differ (the full "
        "translation is then used)",
    )  # fmt: skip
    restore: Restore = setting(
        Restore.ON, HISTORY,
        "restore harness-re-rendered echoes before rendering (on), in the tree only, or off",
    )  # fmt: skip
    # Restore an echo whose tool calls carry the ids we minted (and name the same tools),
    # whatever the harness did to their arguments; off: the coarse comparison alone.
    restore_by_id: bool = setting(
        True, HISTORY,
        "restore an echo whose tool calls carry the ids tokentrail minted (and name the same "
        "tools) whatever the harness changed in their arguments; --no-restore-by-id leaves "
        "echoes to the coarse comparison (declared defaults, trailing whitespace) alone",
    )  # fmt: skip
    # -- sessions and retries
    # What a retried request gets (a session's own rule and the request's header come first).
    retry: Retry = setting(
        Retry.REPLAY, SESSIONS,
        "a retried request: answer with the recorded reply (replay) or generate again (fresh); "
        "the X-Tokentrail-Retry header chooses per request",
        name="retries",
    )  # fmt: skip
    # Let OpenAI bodies (`metadata.session_id`, `user`) name the session instead of the key.
    session_from_body: bool = setting(
        False, SESSIONS,
        "let OpenAI bodies (metadata.session_id, user) name the session instead of the API "
        "key: only when every client is trusted",
    )  # fmt: skip
    max_turns_per_session: int = setting(0, SESSIONS, "turns a session may take; 0: any")
    # The rollout's context budget: a prompt over it is refused with the API's "prompt is too
    # long" (so a harness compacts); 0: no budget beyond the model's context length.
    max_context_tokens: int = setting(
        0, SESSIONS,
        "a prompt over this is refused as too long, so a harness compacts (a rollout budget); "
        "0: the model's context",
        unit="tokens",
    )  # fmt: skip
    # Open sessions at most (0: no cap); sessions idle this long are evicted (0: never).
    max_sessions: int = setting(10_000, SESSIONS, "open sessions (503 past it); 0: no cap")
    # Resident bytes the adapter admits work up to (`adapter.http.memory`); 0: half the machine's.
    max_memory: int = setting(
        0, SESSIONS,
        "resident memory the adapter admits work up to: 429/529 with Retry-After past it; "
        "0: half the machine's (or its cgroup's limit)",
        unit="bytes", default_text="0 (half the machine's)",
    )  # fmt: skip
    session_idle_ttl_s: float = setting(
        3 * 3600.0, SESSIONS, "evict sessions idle this long; 0: never", unit="s",
        bounds=(0, MAX_SECONDS), name="session_idle_ttl",
    )  # fmt: skip
    # How long a finished session's samples stay to answer a repeated finish.
    finish_retention_s: float = setting(
        300.0, SESSIONS, "how long a finish is kept to answer a repeat", unit="s",
        bounds=(0, MAX_SECONDS), name="finish_retention",
    )  # fmt: skip
    # Side conversations excluded from training in every session: regular expressions searched
    # in a conversation's first message; `exclude_known_side_requests` adds
    # `side.KNOWN_SIDE_REQUESTS` (the side requests of Qwen Code, hermes-agent, opencode/kilo
    # and Claude Code), each excluded under its rule's name.
    exclude_patterns: tuple[str, ...] = setting(
        (), SESSIONS,
        "exclude side conversations whose first message matches REGEX from training; "
        "repeatable (a JSON list in a variable)",
        metavar="REGEX", name="exclude_system",
    )  # fmt: skip
    exclude_known_side_requests: bool = setting(
        False, SESSIONS,
        "exclude the known side requests of Qwen Code (memory extraction), hermes-agent "
        "(context summarizer, background review), opencode/kilo (title generator) and Claude "
        "Code (session title) from training; the ledger names the rule that fired",
        name="exclude_side_requests",
    )  # fmt: skip
    # -- limits
    limits: Limits = section(Limits)
    # Decoded bytes and pixels of one image and of all of a request's images (400 past them).
    image_limits: ImageLimits = section(ImageLimits)
    # -- replay data
    # Ask the engine for every turn's MoE routed experts / sparse-attention indexer top-k
    # (off by default); the manager's shapes check what comes back and size the store.
    routed_experts: bool = setting(
        False, REPLAY,
        "ask the engine for every turn's MoE routed experts and carry them in the samples",
    )  # fmt: skip
    indexer_topk: bool = setting(
        False, REPLAY, "ask the engine for every turn's sparse-attention indexer top-k (SGLang)"
    )
    # -- streaming
    # Stream replies as they are sampled (`serve --engine-stream`), tokens captured from the
    # engine's own stream; a keepalive whenever nothing else went out for `keepalive_s`.
    live_stream: bool = setting(
        False, STREAMING,
        "stream from the engine (SGLang /generate, vLLM /v1/completions with stream: true; ids "
        "and logprobs taken from the stream) and to the harness as tokens are sampled",
        name="engine_stream",
    )  # fmt: skip
    keepalive_s: float = setting(
        KEEPALIVE_S, STREAMING,
        "with --engine-stream, a keepalive (Anthropic ping, SSE comment) whenever nothing else "
        "went out for this long, so idle timeouts do not fire",
        unit="s", bounds=(0.01, MAX_SECONDS), name="keepalive",
    )  # fmt: skip
    # -- set by the code or a library caller, not a flag
    # Where the protocols read or write the wire as slime's adapters do (slime's drop-in sets
    # them); tokentrail's reading by default.
    wire: WireOptions = internal(DEFAULT_WIRE)
    default_max_tokens: int = internal(4096)
    # Warn once per finished session whose tool-call turns lost more than this share.
    masked_warning_threshold: float = internal(0.05)
    # Refuse turns for sessions not opened with `open_session` (an adapter behind a pool).
    open_sessions_only: bool = internal(False)
    # One line per request (`serve --access-log`, `--access-log-json`); None: off.
    access_log: AccessLog | None = internal(None)

    def __post_init__(self) -> None:
        # The command line's word for off, as a library caller's None.
        if self.tool_parser == "none":
            self.tool_parser = None
        if self.reasoning_parser == "none":
            self.reasoning_parser = None

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
