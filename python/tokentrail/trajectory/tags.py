"""A generated turn's tags: what its record keeps about it beyond its tokens (how the adapter
served it, why it is excluded, what translation withheld or dropped), as one typed record.

The tree and the journal keep the tags as a JSON object, `as_metadata` (the keys below, in this
order, then any a caller added); `read` is the one place that object's keys are read back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class TurnTags:
    """One turn's tags; `as_metadata` writes them, `read` reads them back."""

    # How the adapter served it (written together, when `protocol` is set): the wire
    # protocol, the engine request id, the id its reply was sent with (a Responses
    # `previous_response_id` names it), the ids of its tool calls, and why its output did not
    # parse (None: it did).
    protocol: str | None = None
    request_id: str | None = None
    reply_id: str | None = None
    call_ids: tuple[str, ...] = ()
    ill_formed: str | None = None
    # The ledger's label for how its prompt ids were built (`History`, or a splice fallback).
    history: str | None = None
    # Why it is excluded from training (`side.exclusion`); None when it trains.
    excluded: str | None = None
    # Tools translation withheld from the template, and media it dropped (kind -> count).
    withheld_tools: tuple[str, ...] = ()
    dropped_media: Mapping[str, int] = field(default_factory=dict)
    # A non-default tool choice, the tool it forced, and whether it continued a prefill.
    tool_choice: str | None = None
    forced_tool: str | None = None
    prefill: bool = False
    # Cut short by a client gone mid-stream: recorded, masked `client_disconnected`.
    client_disconnected: bool = False
    # Sampled under a structured-output grammar (a forced tool call): every output token's
    # logprob is the constrained one (`ConstrainedPolicy`).
    constrained: bool = False
    # The call ids of the prompt's echoes this turn first restored by identity, by message
    # index (`trajectory.restore`): a replay of the turn restores them again by these.
    echo_ids: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    # The prompt's images, in token order (`PreparedTurn.image_tags`): each one's digest,
    # type, size, processor grid, token count, first pad token's offset and base64 bytes
    # (one text per image, shared by the turns that hold it; the journal stores the bytes
    # once, by digest: `storage.journal.images`).
    images: tuple[Mapping[str, Any], ...] = ()
    # Keys beyond these (a trainer's own), kept as given.
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def in_samples(self) -> bool:
        """Whether the turn's tokens go into samples: neither excluded nor cut short."""
        return self.excluded is None and not self.client_disconnected

    def as_metadata(self) -> dict[str, Any]:
        """The JSON object the tree and the journal keep."""
        out: dict[str, Any] = {}
        if self.protocol is not None:
            out.update(
                protocol=self.protocol,
                request_id=self.request_id,
                reply_id=self.reply_id,
                call_ids=list(self.call_ids),
                ill_formed=self.ill_formed,
            )
        if self.history is not None:
            out["history"] = self.history
        if self.excluded is not None:
            out["excluded"] = self.excluded
        if self.withheld_tools:
            out["withheld_tools"] = list(self.withheld_tools)
        if self.dropped_media:
            out["dropped_media"] = dict(self.dropped_media)
        if self.tool_choice is not None:
            out["tool_choice"] = self.tool_choice
            if self.forced_tool is not None:
                out["forced_tool"] = self.forced_tool
        if self.prefill:
            out["prefill"] = True
        if self.client_disconnected:
            out["client_disconnected"] = True
        if self.constrained:
            out["constrained"] = True
        if self.echo_ids:
            out["echo_ids"] = {str(i): list(ids) for i, ids in self.echo_ids.items()}
        if self.images:
            out["images"] = [dict(i) for i in self.images]
        out.update(self.extra)
        return out

    @classmethod
    def read(cls, metadata: Mapping[str, Any]) -> TurnTags:
        """The tags `as_metadata` wrote (or a journal of an older tokentrail holds)."""
        get = metadata.get
        # Filled in directly rather than through the frozen `__init__` (one `object.__setattr__`
        # per field): finish reads the tags of every generated turn of a session.
        tags = object.__new__(cls)
        tags.__dict__.update(
            protocol=get("protocol"),
            request_id=get("request_id"),
            reply_id=get("reply_id"),
            call_ids=tuple(get("call_ids") or ()),
            ill_formed=get("ill_formed"),
            history=get("history"),
            excluded=get("excluded") or None,
            withheld_tools=tuple(get("withheld_tools") or ()),
            dropped_media=dict(get("dropped_media") or {}),
            tool_choice=get("tool_choice"),
            forced_tool=get("forced_tool"),
            prefill=bool(get("prefill")),
            client_disconnected=bool(get("client_disconnected")),
            constrained=bool(get("constrained")),
            echo_ids={int(i): tuple(ids) for i, ids in (get("echo_ids") or {}).items()},
            images=tuple(get("images") or ()),
            extra={}
            if _KNOWN.issuperset(metadata)
            else {k: v for k, v in metadata.items() if k not in _KNOWN},
        )
        return tags


# The keys `read` takes as fields (the rest go to `extra`), computed once: `read` runs for
# every generated turn of a session at finish.
_KNOWN = frozenset(f.name for f in fields(TurnTags)) - {"extra"}
