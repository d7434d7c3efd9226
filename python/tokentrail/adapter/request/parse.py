"""What a request must be before any protocol reads it, and the probe a chat template must pass
before the adapter serves with it.

`read_body` reads a body within its size and time limits. `parse_body` turns its bytes into a
JSON object or refuses them with a 400 that names what is wrong and where: bytes that are not
UTF-8, text that is not JSON (`NaN`, `Infinity` and numbers past a double's range included),
nesting deeper than the limit, and a lone surrogate (`"\ud800"`) in any string, named by its
field, since no encoder downstream (the tokenizer, the journal, an HTTP header) can take one.
`session_key` holds a session id to what can travel in a header. `probe_template` renders a
one-message conversation at load, so a template that breaks on every request fails at startup
(after `text.template_check` has rendered the same conversations under a budget).
"""

from __future__ import annotations

import asyncio
import json
import json.scanner
import logging
import math
import re
import zlib
from collections.abc import Callable, Sequence
from typing import Any, cast

from aiohttp import web

from tokentrail.errors import (
    BodyCutShort,
    RequestError,
    RequestTimeout,
    RequestTooLarge,
    TemplateError,
)
from tokentrail.messages import Conversation, Message, ToolSchema
from tokentrail.text.template_check import BASIC_CONVERSATIONS, STARTUP_CONVERSATIONS

logger = logging.getLogger(__name__)

__all__ = [
    "STEPWISE_ABOVE",
    "check_translated",
    "check_tree",
    "decoded_body",
    "field_path",
    "parse_body",
    "probe_template",
    "read_body",
    "session_key",
]

# A lone surrogate can only come from a `\uD800`..`\uDFFF` escape: UTF-8 cannot encode one, so
# bodies without such an escape need no search of their strings.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# Above this many structural bytes a body is parsed in Python steps rather than in one C call,
# so a body of millions of tiny values cannot hold the interpreter (and the event loop waiting
# for it) for a second; below it, one call costs at most a few milliseconds.
STEPWISE_ABOVE = 50_000
# What a session id may be: it travels to the engine in headers and names journal rows.
_SESSION_ID = re.compile(r"[\x21-\x7e]{1,512}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _decoder(stepwise: bool) -> json.JSONDecoder:
    decoder = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)
    if stepwise:
        decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder


def parse_body(raw: bytes, max_depth: int) -> dict[str, Any]:
    """The JSON object in `raw`; `RequestError` (400) for anything else."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"body is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    structural = raw.count(b",") + raw.count(b"{") + raw.count(b"[")
    try:
        body = _decoder(structural > STEPWISE_ABOVE).decode(text)
    except RecursionError:
        raise RequestError(f"body is nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise RequestError(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(f"body must be a JSON object, got {type(body).__name__}")
    check_tree(body, max_depth=max_depth, surrogates=bool(_SURROGATE_ESCAPE.search(raw)))
    return body


def check_tree(
    root: dict[str, Any] | list[Any],
    *,
    max_depth: int,
    surrogates: bool,
    at: tuple[str | int, ...] = (),
) -> None:
    """Refuse nesting deeper than `max_depth` (the body itself is level 1) and, when
    `surrogates`, any string or key holding a lone surrogate. `root` lies at path `at` of the
    body (one level deeper per step). Iterative: no depth can make it recurse."""
    stack: list[tuple[dict[str, Any] | list[Any], int, tuple[str | int, ...]]] = [
        (root, len(at) + 1, at)
    ]
    while stack:
        value, depth, path = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if surrogates:
                if isinstance(key, str) and _lone_surrogate(key):
                    raise RequestError(f"{field_path(path)} has a key with a lone surrogate")
                if isinstance(item, str) and _lone_surrogate(item):
                    raise RequestError(
                        f"{field_path((*path, key))} holds a lone surrogate, which is not valid "
                        "Unicode; send text as UTF-8"
                    )
            if isinstance(item, dict | list):
                if depth + 1 > max_depth:
                    raise RequestError(
                        f"{field_path((*path, key))} is nested deeper than {max_depth} levels"
                    )
                if item:
                    stack.append((item, depth + 1, (*path, key)))


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


def _lone_surrogate(text: str) -> bool:
    return not text.isascii() and _LONE_SURROGATE.search(text) is not None


def field_path(path: Sequence[str | int]) -> str:
    """`("messages", 0, "content")` as `messages[0].content`; the empty path is `body`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    if len(out) > 120:  # a path 800 levels deep is not worth printing whole
        out = f"{out[:60]}...{out[-50:]}"
    return out or "body"


def session_key(sid: object, where: str = "the API key") -> str:
    """A session id as it may travel: 1-512 visible ASCII characters, no spaces or controls
    (it becomes the engine's routing header and a journal key)."""
    if not isinstance(sid, str) or not _SESSION_ID.fullmatch(sid):
        shown = repr(sid)[:80]
        raise RequestError(
            f"{where} must be 1-512 visible ASCII characters without spaces, got {shown}"
        )
    return sid


Render = Callable[[Sequence[Message], Sequence[ToolSchema] | None], str]


def probe_template(render: Render, name: str = "the chat template") -> None:
    """Render a one-message conversation (or, for a template that insists on one, a system and
    a user message) and refuse to start when neither renders; log a warning for a shape that
    fails other than on purpose (`raise_exception`)."""
    failures: list[TemplateError] = []
    for messages in BASIC_CONVERSATIONS:
        try:
            render(messages, None)
            break
        except TemplateError as exc:
            failures.append(exc)
    else:
        raise TemplateError(
            f"{name} cannot render a one-message conversation, so every request would fail: "
            f"{failures[0]}"
        )
    for basic, failure in zip(BASIC_CONVERSATIONS, failures, strict=False):
        if failure.__cause__ is not None:  # not the template's own raise_exception
            logger.warning("%s fails on %d plain messages: %s", name, len(basic), failure)
    for shape, (messages, tools) in STARTUP_CONVERSATIONS.items():
        try:
            render(messages, tools)
        except TemplateError as exc:
            if exc.__cause__ is not None:  # not the template's own raise_exception
                logger.warning("%s fails on a conversation with %s: %s", name, shape, exc)


async def read_body(request: web.Request, *, max_bytes: int, timeout_s: float) -> bytes:
    """The whole body, refused when its Content-Length is over `max_bytes` (before reading
    it), when it grows past that, or when it does not arrive within `timeout_s` (408: a body
    shorter than its Content-Length would otherwise hold the connection forever). A body
    with a `Content-Encoding` is decoded here (`decoded_body`), in a thread."""
    length = request.content_length
    if max_bytes and length is not None and length > max_bytes:
        raise RequestTooLarge(
            f"request body too large: {length} bytes > {max_bytes} (--max-body-bytes)"
        )
    try:
        raw = await asyncio.wait_for(request.read(), timeout_s or None)
    except asyncio.TimeoutError:  # not yet the builtin TimeoutError on 3.10
        expected = f" of the {length} announced" if length is not None else ""
        raise RequestTimeout(
            f"the request body{expected} did not arrive within {timeout_s:g} s (--body-timeout)"
        ) from None
    except web.HTTPRequestEntityTooLarge:
        raise RequestTooLarge(
            f"request body too large: over {max_bytes} bytes (--max-body-bytes)"
        ) from None
    except BodyCutShort:
        # Nothing more can arrive: the body ends here, so the server does not linger to read
        # (and fail on) the rest of it after the answer.
        request.content.feed_eof()
        raise
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return raw
    return await asyncio.to_thread(decoded_body, raw, encoding, max_bytes)


# `Content-Encoding` values a body may come in, with their zlib window bits.
_ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decoded_body(raw: bytes, encoding: str, max_bytes: int) -> bytes:
    """`raw` decoded from its `Content-Encoding`, never to more than `max_bytes` (a small
    body that inflates past the limit is refused as a large one is). The server's own HTTP
    layer does not decode bodies: a body that fails to decode there breaks the connection it
    came on; here it is a 400 and the connection carries on."""
    wbits = _ENCODINGS.get(encoding)
    if wbits is None:
        raise RequestError(
            f"unsupported Content-Encoding {encoding!r}; supported: identity, "
            f"{', '.join(_ENCODINGS)}"
        )
    if encoding == "deflate" and raw and raw[0] & 0xF != 8:
        wbits = -zlib.MAX_WBITS  # raw deflate without the zlib header, as some clients send
    decoder = zlib.decompressobj(wbits)
    try:
        out = decoder.decompress(raw, max_bytes + 1 if max_bytes else 0)
    except zlib.error as exc:
        raise RequestError(
            f"the request body is not valid {encoding} (Content-Encoding: {encoding}): {exc}"
        ) from None
    if max_bytes and len(out) > max_bytes:
        raise RequestTooLarge(
            f"request body too large: over {max_bytes} bytes once decoded from {encoding} "
            "(--max-body-bytes)"
        )
    if not decoder.eof:
        raise RequestError(
            f"the request body is not valid {encoding} (Content-Encoding: {encoding}): "
            "it ends before the compressed stream does"
        )
    return out
