"""Every closed set of names tokentrail uses, as enums in one place.

Drift kinds and policies, rewrite policies, the reasons a generated token is masked, the replay
channels and why a token has no replay row, how a turn's prompt ids were built, pipeline stages,
finish reasons, a journaled session's state and the journal's sync modes, the names reasoning
arrives under. Each is a `StrEnum`, so its members are the very strings the ledger, the journal,
the metrics and the Rust core (`_core.POLICIES`, `_core.CLEAN`, ...) use. A string becomes a
member in one place, `parse_kind`, which names the allowed values when it is none of them.
"""

from __future__ import annotations

from typing import TypeVar

from tokentrail.compat import StrEnum
from tokentrail.errors import InvalidInput, UnknownName

K = TypeVar("K", bound=StrEnum)


def parse_kind(
    kind: type[K], value: object, what: str, error: type[InvalidInput] = UnknownName
) -> K:
    """`value` (a member or its string) as a member of `kind`; anything else raises `error`
    naming the allowed values: `unknown drift policy 'x'; expected one of ('minimal', 'slime')`.
    """
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        # The enum's own value index (a dict): ledgers and journals read thousands of these.
        member = kind._value2member_map_.get(value)
        if member is not None:
            return member  # type: ignore[return-value]
    allowed = ", ".join(repr(member.value) for member in kind)
    raise error(f"unknown {what} {value!r}; expected one of ({allowed})")


class DriftKind(StrEnum):
    """How a turn's prompt relates to the tokens a sample already holds."""

    # The prompt continues the held tokens exactly.
    CLEAN = "clean"
    # The prompt re-renders the latest output differently, within the policy's gate: healed in
    # place, the drifted tokens masked.
    REALIGN = "realign"
    # The prompt diverges beyond the gate: a new sample starts.
    FORK = "fork"


class DriftPolicy(StrEnum):
    """How a small drift is healed."""

    # Gate on the drifted tokens; keep the output up to the divergence (the default).
    MINIMAL = "minimal"
    # slime's rule: gate on the incoming output length; mask the whole latest span.
    SLIME = "slime"


class RewritePolicy(StrEnum):
    """What a harness's rewrite of a short generated answer does to the generated turn."""

    # The generated turn stays a leaf and trains as its own sample (the default).
    FORK = "fork"
    # Upstream behaviour: the generated turn is demoted and masked as `merged_rewrite`.
    MERGE = "merge"


class MaskReason(StrEnum):
    """Why a generated token is not trained. Trained plus masked equals generated."""

    # Re-rendered differently in a later prompt and healed by realignment.
    REALIGNED = "realigned"
    # Demoted by a harness rewrite of its message under `rewrite_policy="merge"`.
    MERGED_REWRITE = "merged_rewrite"
    # Cut by `max_sample_tokens`.
    TRUNCATED = "truncated"
    # A side conversation (a harness's memory agent, summarizer or title request) excluded from
    # training by a system-prompt pattern or the exclusion header: served and journaled, never
    # trained.
    EXCLUDED = "excluded"
    # A generation the harness asked for again from the same prompt and got a fresh one for
    # (nothing was built on it): a dead end the harness discarded, kept out of training.
    SUPERSEDED = "superseded"
    # Cut short by a harness that went away mid-stream: the tokens sampled until the engine
    # was stopped are recorded, and never trained (the harness never saw the whole turn).
    CLIENT_DISCONNECTED = "client_disconnected"
    # Sampled under a structured-output grammar (a forced tool call): the engine computed its
    # logprob after the grammar's mask, so it is not the policy's (`ConstrainedPolicy.MASK`).
    CONSTRAINED = "constrained"
    # Sampled by weights more trainer steps old than the trainer's `max_staleness` allows
    # (`trajectory.staleness`): masked by the trainer after finish, never by the adapter.
    STALE = "stale"
    # Never expected: a token no reason accounts for. Logged as an error when it happens.
    UNACCOUNTED = "unaccounted"


class StalenessPolicy(StrEnum):
    """What a trainer's `max_staleness` does with a sample holding tokens sampled by weights
    too many steps old (`trajectory.staleness.limit_staleness`)."""

    # Those tokens are masked (`MaskReason.STALE`); the rest of the sample trains.
    MASK = "mask"
    # The whole sample is left out of the batch.
    DROP = "drop"


class PauseMode(StrEnum):
    """What vLLM's `/pause` does with the turns it is sampling while weights are pushed
    (`integrations.weights.VLLMWeights.push`)."""

    # Frozen and carried on under the new weights after `/resume`: a turn holds tokens of two
    # versions, and every token says which sampled it.
    KEEP = "keep"
    # Finished under the old weights before the new ones load.
    WAIT = "wait"
    # Stopped (finish `abort`, with the tokens sampled so far); tokentrail's vLLM client
    # generates each again once the engine serves (every token then the new version's), and
    # the ledger records the aborted tokens as the turn's `retried`/`discarded`, never trained.
    ABORT = "abort"


class ConstrainedPolicy(StrEnum):
    """What training does with tokens sampled under a structured-output grammar (a forced tool
    call): the engine reports their logprobs after the grammar's mask, renormalized over the
    tokens it allowed, so they are not the unconstrained policy's a trainer recomputes."""

    # Masked as `constrained` (the default): an importance ratio against them means nothing.
    MASK = "mask"
    # Trained as any other token (their `constrained` mark still says what they are).
    YES = "yes"


class ToolChoice(StrEnum):
    """What a request lets the model do with its tools (Anthropic `tool_choice.type`, OpenAI
    `tool_choice`, in one vocabulary)."""

    # Call a tool or not, as the model decides (the default).
    AUTO = "auto"
    # No tool call: tools are still rendered (the prompt stays the session's), calls are not
    # parsed.
    NONE = "none"
    # At least one call (Anthropic `any`, OpenAI `required`), or a call to one named tool.
    REQUIRED = "required"


class Replay(StrEnum):
    """The per-token data an engine reports beyond ids and logprobs, which a trainer replays so
    training computes the function sampling did."""

    # The experts a MoE router sent each token to: `[layers, top_k]` ids per token.
    ROUTED_EXPERTS = "routed_experts"
    # The top-k positions a sparse-attention indexer (DeepSeek V3.2-style) kept per token.
    INDEXER_TOPK = "indexer_topk"


class ReplayGap(StrEnum):
    """Why a token has no replay row. The core's `REPLAY_STATUS` codes use the same names."""

    # The turn was recorded without it (replay off for the turn, an older journal).
    NOT_REQUESTED = "not_requested"
    # Asked for, but the answer had none: the server lacks `--enable-return-routed-experts`
    # (or `--enable-return-indexer-topk`), or the request was aborted.
    ENGINE_RETURNED_NONE = "engine_returned_none"
    # The rows do not decode to the model's `[tokens, layers, top_k]` or hold ids out of range.
    SHAPE_MISMATCH = "shape_mismatch"
    # The token is the turn's own, but the engine was asked from a later start: the prompt
    # re-rendered tokens an earlier turn held (or a replay re-rendered the recorded prompt).
    RERENDERED_PREFIX = "rerendered_prefix"
    # The engine has no way to report it (the scripted engine; vLLM for the indexer).
    NOT_SUPPORTED = "not_supported"


class Retry(StrEnum):
    """What a request does whose prompt equals that of a recorded turn nothing was built on yet:
    a harness asking again because it never got (or lost) the reply."""

    # Answered with the recorded reply, the same output ids and bytes; nothing is generated or
    # recorded again (the default).
    REPLAY = "replay"
    # Generated again; the earlier generation is superseded (masked as `superseded`).
    FRESH = "fresh"


class JournalEvent(StrEnum):
    """The kinds of event a journal holds, one row each."""

    # A session opened with settings of its own.
    OPEN = "open"
    # A generated turn: what is new since the session's previous turn, and the reply sent.
    TURN = "turn"
    # A recorded turn answered again to a retried request.
    REPLAY = "replay"
    # Events of the session that recovery found lost or damaged; the session goes on from
    # what was intact.
    LOST = "lost"
    FINISH = "finish"
    DROP = "drop"
    # Schema 1 only: the reply of a turn never reached the client.
    RETRACT = "retract"


class Restore(StrEnum):
    """Where recognized echoes are restored."""

    # Before rendering: the prompt and the tree both see the generated message (the default).
    ON = "on"
    # Only in what the tree records; the prompt is rendered from the harness's bytes. Exists to
    # measure what restoring too late costs (token drift), never to run in production.
    TREE_ONLY = "tree_only"
    # Nowhere: the harness's re-rendered echoes go through as they came.
    OFF = "off"


class EchoDifference(StrEnum):
    """What a harness changed in an echo that was restored by identity (its calls' ids are the
    ones we minted, their tools the same) and that the coarse comparison did not recognize."""

    # A tool call's arguments (Claude Code drops a `cd <its own directory> && ` from Bash).
    ARGUMENTS = "arguments"
    # The message's text.
    CONTENT = "content"
    # The reasoning.
    REASONING = "reasoning"
    # Anything else (a key of a call or of the message).
    OTHER = "other"


class History(StrEnum):
    """How a turn's prompt ids are built from the conversation."""

    # Held tokens of the last generated turn, glue, then the new messages' tokens.
    SPLICE = "splice"
    # Render and tokenize the whole conversation (the upstream behaviour).
    RENDER = "render"


class ResumeCheck(StrEnum):
    """What `serve --verify-resume` found when it translated a request both ways."""

    # The resumed translation is the full one.
    SAME = "same"
    # They differ (the full one is used, and a warning names the first difference).
    MISMATCH = "mismatch"


class Fallback(StrEnum):
    """Why a turn that could have been spliced was rendered in full instead."""

    # The sampled output was cut by the length limit and the end the template writes after
    # the turn is not one added token, so the sampled ids cannot be continued exactly.
    LENGTH = "length"
    # The output does not end with an added token (the turn's stop token).
    NO_END_TOKEN = "no_end_token"
    # The template's rendering of the assistant turn has no end marker to cut the glue at.
    NO_BOUNDARY = "no_boundary"
    # Adding messages changed how the synthetic context renders, or the new messages render
    # differently after a longer history: the template is not prefix-preserving.
    NOT_PREFIX = "not_prefix"
    # The full render does not end with the derived glue and tail: the new messages render
    # differently in context (a position-dependent template).
    TAIL_MISMATCH = "tail_mismatch"
    # The template refused the synthetic context.
    TEMPLATE_ERROR = "template_error"
    # The tokenizer is an object without a `tokenizers` backend: every prompt is the object's
    # own `apply_chat_template` ids (`text.object_tokenizer`).
    REFERENCE_TOKENIZER = "reference_tokenizer"

    @property
    def label(self) -> str:
        """The ledger's and the metrics' name for a turn that fell back for this reason."""
        return f"{FALLBACK_PREFIX}{self.value}"


# Ledger JSON keeps a fallen-back turn's history as "splice_fallback:<reason>".
FALLBACK_PREFIX = "splice_fallback:"


class TemplateOutcome(StrEnum):
    """How a chat template's bounded startup renders ended (`text.template_check`)."""

    # Within the budget (whether the renders succeeded is the server's to see).
    FINISHED = "finished"
    # An allocation past the memory budget.
    OUT_OF_MEMORY = "out of memory"
    # Stopped by the CPU limit.
    OUT_OF_TIME = "out of time"
    # Not done within the wall-clock backstop.
    OUT_OF_WALL_TIME = "out of wall time"
    # The checking process itself failed.
    BROKEN = "broken"


class Stage(StrEnum):
    """The stages of one turn, in order; each is timed."""

    TRANSLATE = "translate"
    RESTORE = "restore"
    RENDER = "render"
    TOKENIZE = "tokenize"
    ENGINE = "engine"
    PARSE = "parse"
    RESPOND = "respond"
    RECORD = "record"


class FinishReason(StrEnum):
    """Why the engine stopped sampling a turn."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class EngineFault(StrEnum):
    """Why an engine's answer was refused; the adapter counts each in `/metrics`."""

    # Unreachable, timed out, a non-2xx status or an answer that cannot be read.
    FAILED = "failed"
    # A token id outside the tokenizer's vocabulary (or not an integer).
    TOKEN_ID = "token_id"
    # A logprob that is NaN, infinite or above 0.
    LOGPROB = "logprob"
    # Logprobs and tokens that differ in number.
    LOGPROB_COUNT = "logprob_count"
    # More tokens than the request's `max_new_tokens` (plus one end-of-turn token).
    TOO_LONG = "too_long"
    # No tokens at all, which no finished turn can be.
    EMPTY = "empty"
    # A finish reason outside `FinishReason`.
    FINISH_REASON = "finish_reason"


class Closed(StrEnum):
    """How a session stopped taking turns."""

    FINISHED = "finished"
    DROPPED = "dropped"
    # Idle past the adapter's session TTL: its turns were not linearized.
    EVICTED = "evicted"


class Backend(StrEnum):
    """Which implementation of the hot path runs."""

    RUST = "rust"
    PYTHON = "python"


class LostReason(StrEnum):
    """Why an adapter pool cannot deliver a session's samples (`tokentrail.scale`)."""

    # The session's actor died and Ray will not restart it (restarts used up, or killed for
    # good); its journal may still be on its node's disk, for `tokentrail replay`.
    ACTOR_DIED = "actor_died"
    # The node that held the session's actor and journal is gone.
    NODE_DIED = "node_died"
    # The actor restarted, but its journal did not hold the session (lost or damaged disk).
    NOT_RECOVERED = "not_recovered"
    # The actor died while finishing the session: its journal records the finish, but the
    # samples never reached the pool.
    FINISH_LOST = "finish_lost"
    # The actor's journal lost some of the session's turns (a crash, a damaged file): what is
    # left is not delivered as the whole session (`SessionLost.lost` says what is gone).
    JOURNAL_DAMAGED = "journal_damaged"
    # The actor is restarting and did not come back in time; the pool still holds the session,
    # and a later finish may succeed.
    UNAVAILABLE = "unavailable"


class BranchReason(StrEnum):
    """Why a session's tree branches where it does (the viewer labels each branch with it)."""

    # The line the conversation first took from here.
    MAIN = "main"
    # Another first message: a conversation of its own beside the agent's (another system prompt).
    NEW_CONVERSATION = "new_conversation"
    # Its first user message carries the prompt an `Agent`/`Task` call handed out elsewhere.
    SUBAGENT = "subagent"
    # A side conversation excluded from training (pattern or header).
    EXCLUDED = "excluded"
    # The harness asked again from the same prompt and got a fresh generation.
    RETRY = "retry"
    # The harness sent another message here than before: an edited or compacted history.
    REWRITTEN = "rewritten"


class SettingGroup(StrEnum):
    """The groups `tokentrail serve --help` shows its settings in, in this order."""

    SERVER = "server"
    ENGINE = "engine and model"
    HISTORY = "history and splicing"
    SESSIONS = "sessions and retries"
    LIMITS = "limits"
    JOURNAL = "journal"
    REPLAY = "replay data"
    STREAMING = "streaming"
    LOGGING = "logging"


class SettingSource(StrEnum):
    """Where a resolved setting came from, the first that has it winning."""

    COMMAND_LINE = "command line"
    ENVIRONMENT = "environment"
    CONFIG_FILE = "config file"
    DEFAULT = "default"


class Verdict(StrEnum):
    """What one `tokentrail doctor` check found."""

    OK = "ok"
    # Serving works, with a gap an operator should know of (no journal, no admin token).
    WARN = "warn"
    FAIL = "FAIL"
    # Not tried: it needs what an earlier check could not load.
    SKIP = "skip"


class TreeMask(StrEnum):
    """The attention mask `PrefixTree.to_torch` builds for the tree layout."""

    # A boolean `[1, 1, nodes, nodes]` tensor for `scaled_dot_product_attention` (True: attend).
    DENSE = "dense"
    # A flex-attention `BlockMask` from the preorder bounds (torch >= 2.5), no dense tensor.
    FLEX = "flex"
    # No mask: the trainer builds its own from `subtree_end` (or `parent`).
    NONE = "none"


class JournalState(StrEnum):
    """Where a journaled session stands."""

    # Still taking turns (or cut off by a crash: recovery picks it up).
    LIVE = "live"
    FINISHED = "finished"
    DROPPED = "dropped"


class SyncMode(StrEnum):
    """How hard a journal commit waits for the disk (SQLite's `synchronous`)."""

    # A commit survives a crash of the process (the default).
    NORMAL = "normal"
    # A commit also survives a power loss or kernel crash: an fsync per event.
    FULL = "full"


class ReasoningField(StrEnum):
    """The names a message's reasoning arrives under (OpenAI-compatible servers differ), in the
    order they are read: templates read `reasoning_content`, gpt-oss templates `thinking`. The
    same order and aliasing as transformers."""

    REASONING_CONTENT = "reasoning_content"
    THINKING = "thinking"
    REASONING = "reasoning"


REASONING_FIELDS: tuple[str, ...] = tuple(field.value for field in ReasoningField)
