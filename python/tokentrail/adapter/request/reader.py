"""A request's bytes to a checked turn request, in a worker: parse (reusing what the body
shares with the session's previous one, `adapter.reuse`), check the limits, name the session,
translate (under `serve --verify-resume` both resumed and in full, compared), check the
sampling.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from tokentrail.adapter.metrics import Metrics
from tokentrail.adapter.protocols import WireProtocol
from tokentrail.adapter.protocols.resume import Translated
from tokentrail.adapter.request.limits import Limits
from tokentrail.adapter.request.parse import check_translated, parse_body, session_key
from tokentrail.adapter.request.translate import (
    KnownRequest,
    Parsed,
    first_difference,
    parse_reusing,
    translate_reusing,
)
from tokentrail.adapter.session.sessions import Sessions
from tokentrail.engines.base import SamplingParams
from tokentrail.errors import RequestError
from tokentrail.kinds import ResumeCheck
from tokentrail.messages import Conversation
from tokentrail.text.vision import ImageCache, ImageLimits, resolve_images, warm
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.pipeline import TurnPipeline
from tokentrail.trajectory.tags import TurnTags

__all__ = ["EXCLUDE_HEADER", "RequestReader", "TurnRequest", "continued"]

logger = logging.getLogger(__name__)

# A request carrying this header (any value but "" or "0") is a side conversation: served and
# journaled, its tokens masked as `excluded` (see `trajectory.side`).
EXCLUDE_HEADER = "X-Tokentrail-Exclude"

_TOOLS = frozenset({"tools"})


@dataclass
class TurnRequest:
    """A turn's request after translation: what the pipeline and the engine need."""

    sid: str
    body: dict[str, Any]
    conversation: Conversation
    sampling: SamplingParams
    stream: bool
    # Why the request is a side conversation (`EXCLUDE_HEADER`); None when it trains.
    exclude: str | None = None


class RequestReader:
    """Reads turn requests for one adapter's sessions under its limits."""

    def __init__(
        self,
        *,
        limits: Limits,
        sessions: Sessions,
        pipeline: TurnPipeline,
        default_max_tokens: int,
        resume_checks: Metrics | None = None,
        image_limits: ImageLimits | None = None,
        metrics: Metrics | None = None,
        image_cache: ImageCache | None = None,
    ) -> None:
        """`resume_checks`: translate every request both resumed and in full, and count what
        that found there (`serve --verify-resume`); None: no check. `metrics`: where the
        field values accepted unknown are counted."""
        self.limits = limits
        self.metrics = metrics
        self.resume_checks = resume_checks
        self.sessions = sessions
        self.pipeline = pipeline
        self.manager = pipeline.manager
        self.default_max_tokens = default_max_tokens
        self.image_limits = image_limits or ImageLimits()
        self.image_cache = image_cache if image_cache is not None else ImageCache()
        if pipeline.vision is not None:
            warm(pipeline.vision)

    def parse(self, raw: bytes) -> dict[str, Any]:
        body = parse_body(raw, self.limits.max_json_depth)
        self.limits.check_shape(body)
        return body

    def noted(self, fields: list[str]) -> None:
        if fields and self.metrics is not None:
            self.metrics.unknown_values(fields)
            logger.debug("accepted unknown values of %s", ", ".join(fields))

    def translate(
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

    def with_images(self, conversation: Conversation) -> Conversation:
        """Image marks as the pipeline's family takes them: vision tokens, or `[image]`."""
        return resolve_images(
            conversation, self.pipeline.vision, self.image_limits, self.image_cache
        )

    def count(self, proto: WireProtocol, raw: bytes) -> int:
        """count_tokens: the full render's length; nothing is recorded or opened."""
        body = self.parse(raw)
        self.noted(proto.check_fields(body, counting=True))
        return self.pipeline.count_tokens(self.with_images(self.translate(proto, body)))

    def request(
        self, proto: WireProtocol, raw: bytes, sid: str | None, headers: Mapping[str, str]
    ) -> TurnRequest:
        """Parse, name the session (from the body only when `sid` is None: the operator
        trusts bodies), translate and check the sampling. What the body shares with the
        session's previous request is taken from that one's parse and translation."""
        parsed = parse_reusing(raw, proto, self.sessions.memo.get(sid), self.limits.max_json_depth)
        body = parsed.body
        self.limits.check_shape(body, with_tools=not parsed.unchanged(_TOOLS))
        remember = sid is not None and parsed.index is not None
        if sid is None:
            sid = session_key(proto.session_id(headers, body, trust_body=True), "the session id")
        opened = self.sessions.get(sid)
        defaults = opened.sampling_defaults if opened is not None else {}
        self.noted(proto.check_fields(body, defaults=defaults))
        translated = self._translate(proto, parsed, sid)
        if remember and parsed.index is not None:
            known = KnownRequest(proto.name, raw, parsed.index, body, translated)
            self.sessions.memo.put(sid, known)
        conversation = self.with_images(translated.conversation)
        sampling = (
            SamplingParams(max_new_tokens=self.default_max_tokens)
            .merged(defaults)
            .merged(proto.sampling(body))
        )
        self.limits.check_sampling(sampling)
        header = headers.get(EXCLUDE_HEADER, "")
        exclude = header if header not in ("", "0") else None
        return TurnRequest(sid, body, conversation, sampling, proto.stream_requested(body), exclude)

    def _translate(self, proto: WireProtocol, parsed: Parsed, sid: str) -> Translated:
        """The body translated, resuming the session's previous translation where it can;
        with `resume_checks`, also in full, the two compared (the full one wins)."""
        full = partial(self.translate, proto, parsed.body, sid)
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
