"""Every closed set of names tokentrail uses, as enums in one place.

Drift kinds and policies, rewrite policies, the reasons a generated token is masked, how a turn's
prompt ids were built, pipeline stages, finish reasons. Each is a `StrEnum`, so its members are
the very strings the ledger, the journal, the metrics and the Rust core (`_core.POLICIES`,
`_core.CLEAN`, ...) use.
"""

from __future__ import annotations

from enum import StrEnum


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
    # Never expected: a token no reason accounts for. Logged as an error when it happens.
    UNACCOUNTED = "unaccounted"


class Restore(StrEnum):
    """Where recognized echoes are restored."""

    # Before rendering: the prompt and the tree both see the generated message (the default).
    ON = "on"
    # Only in what the tree records; the prompt is rendered from the harness's bytes. Exists to
    # measure what restoring too late costs (token drift), never to run in production.
    TREE_ONLY = "tree_only"
    # Nowhere: the harness's re-rendered echoes go through as they came.
    OFF = "off"


class History(StrEnum):
    """How a turn's prompt ids are built from the conversation."""

    # Held tokens of the last generated turn, glue, then the new messages' tokens.
    SPLICE = "splice"
    # Render and tokenize the whole conversation (the upstream behaviour).
    RENDER = "render"


class Fallback(StrEnum):
    """Why a turn that could have been spliced was rendered in full instead."""

    # The sampled output was cut by the length limit: no end-of-turn token to splice after.
    LENGTH = "length"
    # The output does not end with the token the template closes an assistant turn with.
    NO_END_TOKEN = "no_end_token"
    # The template's rendering of the assistant turn has no end marker to cut the glue at.
    NO_BOUNDARY = "no_boundary"
    # Adding messages changed how the synthetic context renders: the template is not
    # prefix-preserving.
    NOT_PREFIX = "not_prefix"
    # The full render does not end with the derived glue and tail: the new messages render
    # differently in context (a position-dependent template).
    TAIL_MISMATCH = "tail_mismatch"
    # The template refused the synthetic context.
    TEMPLATE_ERROR = "template_error"

    @property
    def label(self) -> str:
        """The ledger's and the metrics' name for a turn that fell back for this reason."""
        return f"{FALLBACK_PREFIX}{self.value}"


# Ledger JSON keeps a fallen-back turn's history as "splice_fallback:<reason>".
FALLBACK_PREFIX = "splice_fallback:"


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
    # The actor is restarting and did not come back in time; the pool still holds the session,
    # and a later finish may succeed.
    UNAVAILABLE = "unavailable"
