"""A parsed body to tokentrail's conversation: the last step of a body's way through
`adapter.request` (read, parse, limit, translate), checked as the body was.

The translation resumes after the last message the session's previous request had too
(`request.memo`, `protocols.resume`) when the fields it reads are unchanged; only what is new is
translated and checked again. A request that continues an earlier reply (`previous_response_id`)
is that turn's conversation from the session's tree, then the new input. Under
`serve --verify-resume` each body is translated both resumed and in full, and the two compared.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial
from typing import Any, cast

from tokentrail.adapter.metrics import Metrics
from tokentrail.adapter.protocols.base import WireProtocol
from tokentrail.adapter.protocols.resume import ResumableProtocol, Translated
from tokentrail.adapter.request.limits import Limits
from tokentrail.adapter.request.parse import Parsed, check_tree
from tokentrail.errors import RequestError
from tokentrail.kinds import ResumeCheck
from tokentrail.messages import Conversation
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.tags import TurnTags
from tokentrail.trajectory.tree import shared_run

__all__ = [
    "Translator",
    "check_translated",
    "continued",
    "first_difference",
    "translate_reusing",
]

logger = logging.getLogger(__name__)


class Translator:
    """Translates the parsed bodies of one adapter's sessions, held to its limits."""

    def __init__(
        self, manager: TrajectoryManager, limits: Limits, resume_checks: Metrics | None = None
    ) -> None:
        """`resume_checks`: translate every request both resumed and in full, and count what
        that found there (`serve --verify-resume`); None: no check."""
        self.manager = manager
        self.limits = limits
        self.resume_checks = resume_checks

    def whole(
        self, proto: WireProtocol, body: dict[str, Any], sid: str | None = None
    ) -> Conversation:
        """The body in tokentrail's terms, held to the same depth and Unicode rules as the
        body itself (an OpenAI tool call's arguments are JSON inside a string). A request that
        continues an earlier reply (`previous_response_id`) is that turn's conversation from
        the session's tree, then the new input."""
        try:
            conversation = continued(proto, body, self.manager, sid)
        except RecursionError:
            raise RequestError("the request is nested too deep to translate") from None
        check_translated(conversation, max_depth=self.limits.max_json_depth)
        return conversation

    def resumed(self, proto: WireProtocol, parsed: Parsed, sid: str) -> Translated:
        """The body translated, resuming the session's previous translation where it can;
        with `resume_checks`, also in full, the two compared (the full one wins)."""
        full = partial(self.whole, proto, parsed.body, sid)
        if self.resume_checks is None:
            return translate_reusing(proto, parsed, full, self.limits.max_json_depth)
        resumed: Translated | RequestError
        try:
            resumed = translate_reusing(proto, parsed, full, self.limits.max_json_depth)
        except RequestError as refused:
            resumed = refused
        whole: Conversation | RequestError
        try:
            whole = full()
        except RequestError as refused:
            whole = refused
        if isinstance(resumed, RequestError) or isinstance(whole, RequestError):
            difference = None if str(resumed) == str(whole) else f"{resumed!r} != {whole!r}"
        else:
            difference = first_difference(resumed.conversation, whole)
        if difference is None:
            self.resume_checks.resume_checked(ResumeCheck.SAME)
        else:
            self.resume_checks.resume_checked(ResumeCheck.MISMATCH)
            logger.warning(
                "session %s: the resumed translation is not the full one (%s); the full one "
                "is used",
                sid,
                difference,
            )
        if isinstance(whole, RequestError):
            raise whole
        return (
            resumed if difference is None and isinstance(resumed, Translated) else Translated(whole)
        )


def check_translated(
    conversation: Conversation, *, max_depth: int, first: int = 0, tools: bool = True
) -> None:
    """A translated conversation held to the body's depth and Unicode rules (one level
    deeper: an OpenAI tool call's arguments are JSON inside a string), from message `first`
    on, and its tools when `tools` (a caller that checked these very objects before skips
    them)."""
    rules: dict[str, Any] = {"max_depth": max_depth + 1, "surrogates": True}
    for pos in range(first, len(conversation.messages)):
        message = cast(dict[str, Any], conversation.messages[pos])
        check_tree(message, at=("messages", pos), **rules)
    if tools:
        check_tree(conversation.tools or [], at=("tools",), **rules)


def translate_reusing(
    proto: WireProtocol, parsed: Parsed, full: Callable[[], Conversation], max_depth: int
) -> Translated:
    """`parsed.body` translated, resumed from the session's previous request when the messages
    before `parsed.first_changed` and the fields translation reads are unchanged (`full`
    translates and checks it whole otherwise). Only messages and tools new to this request are
    checked again (`check_tree`, one level deeper than a body: arguments are JSON in JSON)."""
    body = parsed.body
    if not isinstance(proto, ResumableProtocol) or proto.continues(body) is not None:
        return Translated(full())
    known = parsed.previous.translated if parsed.previous is not None else None
    if known is None or not parsed.unchanged(proto.context_fields):
        known = None
    try:
        translated = proto.translate_from(body, known, parsed.first_changed)
    except RecursionError:
        raise RequestError("the request is nested too deep to translate") from None
    conversation = translated.conversation
    before = known.conversation if known is not None else None
    shared = 0
    if before is not None:
        messages = conversation.messages
        shared = shared_run(messages, before.messages, len(messages))
    conversation.unchanged = shared
    same_tools = before is not None and conversation.tools is before.tools
    check_translated(conversation, max_depth=max_depth, first=shared, tools=not same_tools)
    return translated


def first_difference(resumed: Conversation, full: Conversation) -> str | None:
    """Where a resumed translation differs from the full one (None: nowhere). Messages are
    compared as JSON, so key order and number types count, as they do in a render."""
    if len(resumed.messages) != len(full.messages):
        return f"{len(resumed.messages)} messages, not {len(full.messages)}"
    for pos, (a, b) in enumerate(zip(resumed.messages, full.messages, strict=True)):
        if json.dumps(a, default=repr) != json.dumps(b, default=repr):
            return f"message {pos}: {json.dumps(a, default=repr)[:200]} is not the full one's"
    fields = {
        "tools": (resumed.tools, full.tools),
        "tool_choice": (resumed.tool_choice, full.tool_choice),
        "forced_tool": (resumed.forced_tool, full.forced_tool),
        "withheld_tools": (resumed.withheld_tools, full.withheld_tools),
        "dropped_media": (resumed.dropped_media, full.dropped_media),
        "call_ids": (resumed.call_ids, full.call_ids),
    }
    return next((name for name, (a, b) in fields.items() if a != b), None)


def continued(
    proto: WireProtocol, body: dict[str, Any], manager: TrajectoryManager, sid: str | None
) -> Conversation:
    """The request's conversation; one that continues an earlier reply (`previous_response_id`)
    is that turn's conversation from the session's tree, then the new input."""
    ref = proto.continues(body)
    if ref is None:
        return proto.translate(body)
    found = manager.find_reply(sid, ref) if sid is not None else None
    if found is None:
        raise RequestError(f"unknown previous response {ref!r} in this session")
    prior, metadata = found
    return proto.translate_after(body, prior, list(TurnTags.read(metadata).call_ids))
