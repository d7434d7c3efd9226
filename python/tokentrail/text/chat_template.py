"""Chat-template rendering that matches transformers' `apply_chat_template(tokenize=False)`.

Same sandbox, filters, globals and message normalization, so a model's own template gives here the
exact prompt text the inference engine builds from the same messages. `ChatTemplate` also hands a
template the message shape it needs, which real templates differ on: tool-call arguments as a
mapping or as JSON text (DeepSeek V3.1 concatenates them), and call ids where a template renders
them (Kimi K2 addresses results by id).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tokentrail.errors import TemplateError
from tokentrail.kinds import REASONING_FIELDS
from tokentrail.text.render_budget import within

# What a failed tool result (`is_error`, Anthropic's flag) renders as: this marker before its
# content. Templates render a tool message's content and nothing else of it, so the marker is
# the one way every template shows the model that the tool failed; the message keeps the flag,
# so an echo of the conversation still routes as the same message.
TOOL_ERROR_MARKER = "Error: "


def render(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    *,
    budget_s: float = 0.0,
    **kwargs: Any,
) -> str:
    """Render `messages` (and `tools`) with a Jinja chat template, as transformers would,
    within `budget_s` seconds (`text.render_budget`; 0: no budget).

    Extra keyword arguments (`enable_thinking`, `eos_token`, ...) are passed to the template.
    """
    compiled = _compile(template)
    kwargs.setdefault("documents", None)
    try:
        chat = [_normalize_message(m) for m in messages]
        return within(
            budget_s,
            lambda: compiled.render(
                messages=chat,
                tools=_plain(list(tools)) if tools is not None else None,
                add_generation_prompt=add_generation_prompt,
                **_plain(kwargs),
            ),
        )
    except TemplateError:
        raise  # the template's own `raise_exception`, or a message it cannot take
    except jinja2.TemplateError as exc:
        raise TemplateError(str(exc)) from exc
    except Exception as exc:
        # A template is code: a range over the sandbox's limit, recursion past Python's, a
        # type error on an unexpected message. Each is the template refusing this input.
        raise TemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class TemplateNeeds:
    """What a template needs from messages beyond tokentrail's internal format."""

    # Tool-call arguments as JSON text rather than a mapping.
    arguments_as_text: bool = False
    # Tool-call ids (`tool_calls[].id`, `tool_call_id` on results): the template renders them.
    call_ids: bool = False


_PROBE_KEY, _PROBE_VALUE, _PROBE_ID = "probe_key", "probe value", "probe-call-id-7"


def _probe(template: str, arguments: Any) -> str | None:
    call = {
        "type": "function",
        "id": _PROBE_ID,
        "function": {"name": "probe_tool", "arguments": arguments},
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "probe"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "probe result", "tool_call_id": _PROBE_ID},
    ]
    try:
        return render(template, messages, add_generation_prompt=True)
    except TemplateError as exc:
        if isinstance(exc.__cause__, MemoryError):
            raise  # not the template refusing the shape: the bounded check must see it
        return None


@functools.lru_cache(maxsize=64)
def template_needs(template: str) -> TemplateNeeds:
    """Probe `template` with one tool call: does it take arguments as a mapping or as JSON text,
    and does it render call ids? A mapping is preferred wherever it renders."""
    as_dict = _probe(template, {_PROBE_KEY: _PROBE_VALUE})
    as_text = _probe(template, json.dumps({_PROBE_KEY: _PROBE_VALUE}))
    # A mapping concatenated as text shows Python's repr: the template wanted JSON text.
    dict_ok = as_dict is not None and f"{{'{_PROBE_KEY}'" not in as_dict
    text_needed = not dict_ok and as_text is not None
    rendered = as_text if text_needed else as_dict
    return TemplateNeeds(text_needed, rendered is not None and _PROBE_ID in rendered)


class ChatTemplate:
    """A chat template and the message shape it needs (`TemplateNeeds`, probed once).

    `call_id` formats the ids a template that renders them gets (`{name}`, `{index}`: the
    conversation's calls counted from 0); ids are positional, so every render of a conversation
    gives the same ones whatever ids the harness used.
    """

    def __init__(self, source: str, call_id: str = "call_{index}", budget_s: float = 0.0) -> None:
        """`budget_s`: how long one render may run (`text.render_budget`; 0: no budget)."""
        self.source = source
        self.call_id = call_id
        self.budget_s = budget_s
        self.needs = template_needs(source)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        *,
        first_call_index: int = 0,
        **kwargs: Any,
    ) -> str:
        """Render `messages` as `render` does, shaped as the template needs; their calls are
        numbered from `first_call_index` (the calls before them in the conversation)."""
        if self.needs.arguments_as_text or self.needs.call_ids:
            messages = self.shaped(messages, first_call_index)
        return render(
            self.source, messages, tools, add_generation_prompt, budget_s=self.budget_s, **kwargs
        )

    def shaped(
        self, messages: Sequence[Mapping[str, Any]], first_call_index: int = 0
    ) -> list[dict[str, Any]]:
        out = []
        index = first_call_index
        pending: list[str] = []
        for message in messages:
            message = dict(message)
            if message.get("role") == "assistant" and message.get("tool_calls"):
                calls, pending = [], []
                for call in message["tool_calls"]:
                    call = dict(call)
                    fn = dict(call.get("function") or {})
                    if self.needs.arguments_as_text:
                        fn["arguments"] = _arguments_text(fn.get("arguments"))
                    call["function"] = fn
                    if self.needs.call_ids:
                        call["id"] = self.call_id.format(name=fn.get("name", ""), index=index)
                        pending.append(call["id"])
                    index += 1
                    calls.append(call)
                message["tool_calls"] = calls
            elif message.get("role") == "tool" and self.needs.call_ids and pending:
                # Results answer the calls before them in order, as harnesses send them.
                message["tool_call_id"] = pending.pop(0)
            out.append(message)
        return out


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    if isinstance(arguments, Mapping) and set(arguments) == {"_raw_arguments"}:
        return str(arguments["_raw_arguments"])  # the wire carried text that is not JSON
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)


def _normalize_message(message: Any) -> dict[str, Any]:
    message = _plain(message)
    if not isinstance(message, dict):
        raise TemplateError(f"a chat message must be a dict, got {message!r}")
    # Like apply_chat_template: a key set to None is dropped, since templates test `is defined`
    # (OpenAI clients send `content: null` next to tool calls).
    message = {k: v for k, v in message.items() if v is not None}
    if message.get("role") == "tool" and message.get("is_error") is True:
        message["content"] = _marked_error(message.get("content"))
    reasoning = next((message[k] for k in REASONING_FIELDS if k in message), None)
    if reasoning is not None:
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


def _marked_error(content: Any) -> Any:
    if isinstance(content, list):
        return [{"type": "text", "text": TOOL_ERROR_MARKER}, *content]
    return TOOL_ERROR_MARKER + ("" if content is None else str(content))


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
