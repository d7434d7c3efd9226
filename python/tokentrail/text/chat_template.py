"""Chat-template rendering that matches transformers' `apply_chat_template(tokenize=False)`.

Same sandbox, filters, globals and message normalization, so a model's own template gives here the
exact prompt text the inference engine builds from the same messages.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tokentrail.errors import TemplateError

# The names a message's reasoning arrives under (OpenAI-compatible servers differ); templates read
# `reasoning_content`, gpt-oss templates `thinking`. Same order and aliasing as transformers.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def render(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> str:
    """Render `messages` (and `tools`) with a Jinja chat template, as transformers would.

    Extra keyword arguments (`enable_thinking`, `eos_token`, ...) are passed to the template.
    """
    compiled = _compile(template)
    kwargs.setdefault("documents", None)
    try:
        chat = [_normalize_message(m) for m in messages]
        return compiled.render(
            messages=chat,
            tools=_plain(list(tools)) if tools is not None else None,
            add_generation_prompt=add_generation_prompt,
            **_plain(kwargs),
        )
    except TemplateError:
        raise  # the template's own `raise_exception`, or a message it cannot take
    except jinja2.TemplateError as exc:
        raise TemplateError(str(exc)) from exc
    except Exception as exc:
        # A template is code: a range over the sandbox's limit, recursion past Python's, a
        # type error on an unexpected message. Each is the template refusing this input.
        raise TemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from exc


def _normalize_message(message: Any) -> dict[str, Any]:
    message = _plain(message)
    if not isinstance(message, dict):
        raise TemplateError(f"a chat message must be a dict, got {message!r}")
    # Like apply_chat_template: a key set to None is dropped, since templates test `is defined`
    # (OpenAI clients send `content: null` next to tool calls).
    message = {k: v for k, v in message.items() if v is not None}
    reasoning = next((message[k] for k in _REASONING_FIELDS if k in message), None)
    if reasoning is not None:
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


def _plain(value: Any) -> Any:
    # Templates are untrusted code in a sandbox: hand them plain JSON-like data only, never objects
    # whose methods the sandbox does not know about.
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models (OpenAI SDK messages)
        return _plain(value.model_dump())
    if callable(getattr(value, "item", None)):  # numpy scalars
        return _plain(value.item())
    return f"<{type(value).__name__}>"


# --- the environment ----------------------------------------------------------------------------


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`, which transformers uses to mark assistant text.

    Rendered as its body: tokentrail takes loss masks from its token ledger, not from templates.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """`namespace()` refusing underscore attributes, so templates cannot reach CPython internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' `tojson` filter: plain `json.dumps`, non-ASCII kept, no HTML escaping."""
    try:
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )
    except TypeError as exc:  # e.g. an undefined template variable
        raise TemplateError(f"tojson: {exc}") from exc


def raise_exception(message: str) -> None:
    """Template global: abort rendering with a `TemplateError`."""
    raise TemplateError(message)


def strftime_now(format: str) -> str:
    """Template global: the local time, formatted (some templates print today's date)."""
    return datetime.now().strftime(format)


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["namespace"] = _Namespace
    return env


@functools.lru_cache(maxsize=64)
def _compile(template: str) -> jinja2.Template:
    try:
        return _environment().from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"chat template syntax error, line {exc.lineno}: {exc.message}"
        ) from exc
    except Exception as exc:
        raise TemplateError(f"the chat template cannot be compiled: {exc}") from exc
