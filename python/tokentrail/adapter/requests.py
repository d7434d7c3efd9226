"""A request's bytes to a checked turn request, in a worker: parse (reusing what the body
shares with the session's previous one, `adapter.reuse`), check the limits, name the session,
translate, check the sampling.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from tokentrail.adapter.limits import Limits
from tokentrail.adapter.protocols import WireProtocol
from tokentrail.adapter.reuse import KnownRequest, parse_reusing, translate_reusing
from tokentrail.adapter.sessions import Sessions
from tokentrail.adapter.validation import check_translated, parse_body, session_key
from tokentrail.engines.base import SamplingParams
from tokentrail.errors import RequestError
from tokentrail.messages import Conversation
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.pipeline import TurnPipeline
from tokentrail.trajectory.tags import TurnTags

__all__ = ["EXCLUDE_HEADER", "RequestReader", "TurnRequest", "continued"]

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
    ) -> None:
        self.limits = limits
        self.sessions = sessions
        self.pipeline = pipeline
        self.manager = pipeline.manager
        self.default_max_tokens = default_max_tokens

    def parse(self, raw: bytes) -> dict[str, Any]:
        body = parse_body(raw, self.limits.max_json_depth)
        self.limits.check_shape(body)
        return body

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

    def count(self, proto: WireProtocol, raw: bytes) -> int:
        """count_tokens: the full render's length; nothing is recorded or opened."""
        return self.pipeline.count_tokens(self.translate(proto, self.parse(raw)))

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
        translated = translate_reusing(
            proto,
            parsed,
            partial(self.translate, proto, body, sid),
            self.limits.max_json_depth,
        )
        if remember and parsed.index is not None:
            known = KnownRequest(proto.name, raw, parsed.index, body, translated)
            self.sessions.memo.put(sid, known)
        conversation = translated.conversation
        opened = self.sessions.get(sid)
        sampling = (
            SamplingParams(max_new_tokens=self.default_max_tokens)
            .merged(opened.sampling_defaults if opened is not None else {})
            .merged(proto.sampling(body))
        )
        self.limits.check_sampling(sampling)
        header = headers.get(EXCLUDE_HEADER, "")
        exclude = header if header not in ("", "0") else None
        return TurnRequest(sid, body, conversation, sampling, proto.stream_requested(body), exclude)


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
