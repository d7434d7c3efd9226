"""A request's bytes to a checked turn request, in a worker: the steps of `adapter.request`, each
once and in order: parse (`request.parse`, reusing what the body shares with the session's
previous one), check the body's shape against the limits (`request.limits`), name the session,
translate (`request.translate`, under `serve --verify-resume` both resumed and in full,
compared), then check the sampling against the limits. The turn (`adapter.turn`) takes it from
there.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokentrail.adapter.metrics import Metrics
from tokentrail.adapter.protocols.base import WireProtocol
from tokentrail.adapter.request.limits import Limits
from tokentrail.adapter.request.memo import KnownRequest
from tokentrail.adapter.request.parse import parse_body, parse_reusing
from tokentrail.adapter.request.translate import Translator
from tokentrail.adapter.session.sessions import Sessions
from tokentrail.engines.base import SamplingParams
from tokentrail.errors import RequestError
from tokentrail.messages import Conversation
from tokentrail.text.vision import ImageCache, ImageLimits, resolve_images, warm
from tokentrail.trajectory.pipeline import TurnPipeline

__all__ = ["EXCLUDE_HEADER", "RequestReader", "TurnRequest", "session_key"]

logger = logging.getLogger(__name__)

# A request carrying this header (any value but "" or "0") is a side conversation: served and
# journaled, its tokens masked as `excluded` (see `trajectory.side`).
EXCLUDE_HEADER = "X-Tokentrail-Exclude"
# What a session id may be: it travels to the engine in headers and names journal rows.
_SESSION_ID = re.compile(r"[\x21-\x7e]{1,512}")

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
        self.sessions = sessions
        self.pipeline = pipeline
        self.translator = Translator(pipeline.manager, limits, resume_checks)
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

    def with_images(self, conversation: Conversation, plain: int = 0) -> Conversation:
        """Image marks as the pipeline's family takes them: vision tokens, or `[image]`.
        The first `plain` messages are known to hold none (see `resolve_images`)."""
        return resolve_images(
            conversation, self.pipeline.vision, self.image_limits, self.image_cache, plain
        )

    def count(self, proto: WireProtocol, raw: bytes) -> int:
        """count_tokens: the full render's length; nothing is recorded or opened."""
        body = self.parse(raw)
        self.noted(proto.check_fields(body, counting=True))
        return self.pipeline.count_tokens(self.with_images(self.translator.whole(proto, body)))

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
        # A tools list that kept its bytes passed these checks with the session's previous
        # request (the memo holds a request only once it is accepted): not checked again.
        fields = (
            {k: v for k, v in body.items() if k not in _TOOLS} if parsed.unchanged(_TOOLS) else body
        )
        self.noted(proto.check_fields(fields, defaults=defaults))
        translated = self.translator.resumed(proto, parsed, sid)
        # The messages the previous request's translation shares (the very objects) were
        # looked at for images then.
        previous = parsed.previous
        plain = translated.conversation.unchanged if previous and previous.plain else 0
        conversation = self.with_images(translated.conversation, plain)
        if remember and parsed.index is not None:
            unresolved = conversation is translated.conversation
            known = KnownRequest(proto.name, raw, parsed.index, body, translated, unresolved)
            self.sessions.memo.put(sid, known)
        sampling = (
            SamplingParams(max_new_tokens=self.default_max_tokens)
            .merged(defaults)
            .merged(proto.sampling(body))
        )
        self.limits.check_sampling(sampling)
        header = headers.get(EXCLUDE_HEADER, "")
        exclude = header if header not in ("", "0") else None
        return TurnRequest(sid, body, conversation, sampling, proto.stream_requested(body), exclude)


def session_key(sid: object, where: str = "the API key") -> str:
    """A session id as it may travel: 1-512 visible ASCII characters, no spaces or controls
    (it becomes the engine's routing header and a journal key)."""
    if not isinstance(sid, str) or not _SESSION_ID.fullmatch(sid):
        shown = repr(sid)[:80]
        raise RequestError(
            f"{where} must be 1-512 visible ASCII characters without spaces, got {shown}"
        )
    return sid
