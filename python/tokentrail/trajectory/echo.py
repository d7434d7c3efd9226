"""Echo recognition: is an incoming message a harness's re-rendering of one the model generated?

Harnesses replay earlier assistant turns re-rendered, not byte-identical: Claude Code fills in
schema defaults and right-strips lines, hermes-agent strips whitespace off both ends of every
content string, drops the reasoning and re-serializes tool-call arguments (sorted keys, compact
separators, non-ASCII escaped), Qwen Code trims the reasoning. `echo_view` maps a message and
its re-renderings onto one comparable form; `is_echo` also accepts an echo whose reasoning the
harness dropped. Everything else must match.

This module recognizes an echo and keeps no state about any session; restoring one (walking a
session's tree and substituting what was generated) is `restore.py`'s.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tokentrail.errors import MessageError
from tokentrail.kinds import REASONING_FIELDS

__all__ = [
    "ToolDefaults",
    "echo_difference",
    "echo_normalize",
    "echo_view",
    "is_echo",
]

logger = logging.getLogger(__name__)

# The view is built from tagged tuples so that Python's `True == 1` and `False == 0` cannot leak
# into a comparison: a bool stays a bool, a number is wrapped, and neither equals the other.
# Strings and None stay as they are; they never compare equal to any other JSON type.
_NUMBER = "number"
_ARRAY = "array"
_OBJECT = "object"

# What Claude Code strips at the end of each line. ASCII only: a harness that also strips
# NBSP or other Unicode spaces would go unrecognized, which costs an echo, never correctness.
_TRAILING_WS = " \t\r\f\v"

# Keys whose string values are identifiers, compared byte for byte rather than as text.
_MESSAGE_IDENTIFIERS = frozenset({"role"})
# A message's own text fields: harnesses strip whitespace off both ends of them (hermes-agent
# every content string, Qwen Code the reasoning), so their views are stripped at both ends too.
# Argument strings are not: leading whitespace there is code (indentation).
_MESSAGE_TEXTS = frozenset({"content", *REASONING_FIELDS})
_FUNCTION_IDENTIFIERS = frozenset({"name"})

# Compiled tables of recent tool lists (by identity): one per active session's tools.
_CACHE_SIZE = 64


@dataclass(frozen=True, slots=True)
class _Node:
    """The parts of one JSON schema that decide which values are defaults, compiled.

    `props` maps a property name to (its default's view or _NO_DEFAULT, its node or None); `items`
    is the node applied to every array element. A node exists only if some default lies below.
    """

    props: Mapping[str, tuple[object, _Node | None]] = field(default_factory=dict)
    items: _Node | None = None


# A sentinel distinct from every view, including None (the view of a JSON null default).
_NO_DEFAULT = object()


def _compile(schema: object) -> _Node | None:
    """Compile the default-bearing parts of a schema; None when nothing below has a default.

    Only `properties` and `items` (a single schema) are followed. `$ref`, `anyOf`, `oneOf`,
    `allOf`, `prefixItems`, `additionalProperties` and `patternProperties` are not: which branch
    applies to a value is a guess, and a wrong guess would call two different calls equal.
    """
    if not isinstance(schema, Mapping):
        return None
    props: dict[str, tuple[object, _Node | None]] = {}
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        for name, sub in properties.items():
            if not isinstance(name, str) or not isinstance(sub, Mapping):
                continue
            child = _compile(sub)
            # The default is viewed through its own sub-schema, so a default object that spells
            # out its nested defaults equals one that leaves them implicit.
            default = _view(sub["default"], child, "default") if "default" in sub else _NO_DEFAULT
            if default is not _NO_DEFAULT or child is not None:
                props[name] = (default, child)
    items = _compile(schema.get("items"))
    if not props and items is None:
        return None
    return _Node(props=props, items=items)


def _tool_name_and_schema(tool: object) -> tuple[str, object] | None:
    """Read (name, parameters schema) from an OpenAI- or Anthropic-style tool; None if neither."""
    if not isinstance(tool, Mapping):
        return None
    fn = tool.get("function")
    if isinstance(fn, Mapping):
        name, schema = fn.get("name"), fn.get("parameters")
    else:
        # Anthropic (`input_schema`) and flat OpenAI Responses (`parameters`) tools.
        name = tool.get("name")
        schema = tool.get("input_schema", tool.get("parameters"))
    if not isinstance(name, str):
        return None
    return name, schema


class ToolDefaults:
    """Per-tool default tables compiled once from a tools list, for repeated `echo_view` calls.

    Accepts OpenAI-style (`function.parameters`) and Anthropic-style (`input_schema`) tools. A
    tool name declared twice gets no table: which schema the harness used is unknown, so only
    the whitespace view applies to its calls.
    """

    __slots__ = ("_nodes",)

    def __init__(self, tools: Sequence[Mapping[str, object]] | None) -> None:
        nodes: dict[str, _Node | None] = {}
        ambiguous: set[str] = set()
        for tool in tools or ():
            parsed = _tool_name_and_schema(tool)
            if parsed is None:
                continue
            name, schema = parsed
            if name in nodes:
                ambiguous.add(name)
            nodes[name] = _compile(schema)
        for name in ambiguous:
            logger.debug("tool %r is declared more than once; its defaults are ignored", name)
            nodes[name] = None
        self._nodes = {name: node for name, node in nodes.items() if node is not None}

    def node(self, tool_name: str) -> _Node | None:
        return self._nodes.get(tool_name)

    def __repr__(self) -> str:
        return f"ToolDefaults(tools with defaults: {sorted(self._nodes)})"


_EMPTY = ToolDefaults(None)

# Keyed by id(tools). The entry keeps the list alive, so its id cannot be recycled by another
# list while cached; a list mutated in place after its first use is NOT noticed (build a new
# list, as every parsed request does, or pass a ToolDefaults). Bounded: one request's tools are
# viewed many times within a turn and rarely again.
_cache: dict[int, tuple[object, ToolDefaults]] = {}
_cache_lock = threading.Lock()


def _defaults_for(tools: Sequence[Mapping[str, object]] | ToolDefaults | None) -> ToolDefaults:
    if tools is None:
        return _EMPTY
    if isinstance(tools, ToolDefaults):
        return tools
    key = id(tools)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] is tools:
            return hit[1]
    compiled = ToolDefaults(tools)
    with _cache_lock:
        if len(_cache) >= _CACHE_SIZE:
            del _cache[next(iter(_cache))]
        _cache[key] = (tools, compiled)
    return compiled


def _rstrip_lines(text: str) -> str:
    if "\n" not in text:
        return text.rstrip(_TRAILING_WS)
    return "\n".join(line.rstrip(_TRAILING_WS) for line in text.split("\n"))


def _str_key(key: object, path: str) -> str:
    if not isinstance(key, str):
        raise MessageError(f"{path}: object key {key!r} is not a string")
    return key


def _view(value: object, node: _Node | None, path: str) -> object:
    """The view of one JSON value under the schema node that describes it (None: no schema)."""
    if isinstance(value, str):
        return _rstrip_lines(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        # JSON has one number type and JavaScript re-serializes 1.0 as 1, so 1 and 1.0 are the
        # same value here (Python's int/float equality and hash already agree on that).
        return (_NUMBER, value)
    if isinstance(value, Mapping):
        return _view_object(value, node, path)
    if isinstance(value, list | tuple):
        items = node.items if node is not None else None
        return (_ARRAY, tuple(_view(v, items, f"{path}[{i}]") for i, v in enumerate(value)))
    raise MessageError(f"{path}: {type(value).__name__} is not a JSON value")


def _view_object(value: Mapping[object, object], node: _Node | None, path: str) -> object:
    props = node.props if node is not None else {}
    out: list[tuple[str, object]] = []
    for raw_key, sub in value.items():
        key = _str_key(raw_key, path)
        default, child = props.get(key, (_NO_DEFAULT, None))
        v = _view(sub, child, f"{path}.{key}")
        # Comparing views, not raw values: an argument equal to the default only after its
        # lines are right-stripped is still the default once the harness has stripped it.
        if default is not _NO_DEFAULT and v == default:
            continue
        out.append((key, v))
    # Key order is not part of a JSON object's meaning, and the harness reorders (Claude Code
    # puts a filled-in `replace_all` first).
    out.sort(key=lambda kv: kv[0])
    return (_OBJECT, tuple(out))


def _view_tool_call(call: object, defaults: ToolDefaults, path: str) -> object:
    if not isinstance(call, Mapping):
        return _view(call, None, path)
    fn = call.get("function")
    out: list[tuple[str, object]] = []
    for raw_key, sub in call.items():
        key = _str_key(raw_key, path)
        sub_path = f"{path}.{key}"
        if key == "function" and isinstance(fn, Mapping):
            out.append((key, _view_function(fn, defaults, sub_path)))
        elif key == "type" and isinstance(sub, str):
            out.append((key, sub))
        else:
            out.append((key, _view(sub, None, sub_path)))
    out.sort(key=lambda kv: kv[0])
    return (_OBJECT, tuple(out))


def _json_object(text: str) -> Mapping[str, object] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _view_function(fn: Mapping[object, object], defaults: ToolDefaults, path: str) -> object:
    name = fn.get("name")
    node = defaults.node(name) if isinstance(name, str) else None
    out: list[tuple[str, object]] = []
    for raw_key, sub in fn.items():
        key = _str_key(raw_key, path)
        sub_path = f"{path}.{key}"
        if key in _FUNCTION_IDENTIFIERS and isinstance(sub, str):
            out.append((key, sub))
        elif key == "arguments":
            # Arguments a protocol carries as a JSON string are the object they encode: key
            # order, separators and escapes are the serializer's, not the model's (a
            # restore gives back the generated bytes). A string that is no JSON object stays
            # text.
            parsed = _json_object(sub) if isinstance(sub, str) else None
            out.append((key, _view(sub if parsed is None else parsed, node, sub_path)))
        else:
            out.append((key, _view(sub, None, sub_path)))
    out.sort(key=lambda kv: kv[0])
    return (_OBJECT, tuple(out))


def echo_view(
    message: Mapping[str, object], tools: Sequence[Mapping[str, object]] | ToolDefaults | None
) -> object:
    """A hashable canonical view of a message; an echo and its original have the same view.

    These re-renderings are undone: a tool-call argument equal to the default its tool's schema
    declares (at the top level, in nested `properties`, in array `items`) is dropped; every
    string value's lines are right-stripped (`role`, tool-call `type` and function `name` are
    identifiers and kept as they are); the message's own texts (`content`, the reasoning) are
    also stripped at both ends, and an empty reasoning is none; arguments given as a JSON
    string are viewed as the object they encode. Everything else must match exactly; a bool
    never equals a number, 1 equals 1.0, and object key order is ignored. With no schema for a
    tool (tools None, or the tool undeclared) only the whitespace view applies to its calls.

    The view is opaque: compare it, hash it (e.g. to index generated messages by their view),
    or read it back with `echo_normalize`.
    """
    if not isinstance(message, Mapping):
        raise MessageError(f"message: expected a dict, got {type(message).__name__}")
    defaults = _defaults_for(tools)
    out: list[tuple[str, object]] = []
    for raw_key, sub in message.items():
        key = _str_key(raw_key, "message")
        if key in _MESSAGE_IDENTIFIERS and isinstance(sub, str):
            out.append((key, sub))
        elif key in _MESSAGE_TEXTS and isinstance(sub, str):
            text = _rstrip_lines(sub.strip())
            # An empty reasoning is no reasoning (OpenAI clients send "" or " " for none).
            if text or key not in REASONING_FIELDS:
                out.append((key, text))
        elif key == "tool_calls" and isinstance(sub, list | tuple):
            calls = tuple(
                _view_tool_call(call, defaults, f"tool_calls[{i}]") for i, call in enumerate(sub)
            )
            out.append((key, (_ARRAY, calls)))
        else:
            out.append((key, _view(sub, None, key)))
    out.sort(key=lambda kv: kv[0])
    return (_OBJECT, tuple(out))


def _thaw(view: object) -> object:
    if isinstance(view, tuple):
        tag, body = view
        if tag == _NUMBER:
            return body
        if tag == _ARRAY:
            return [_thaw(v) for v in body]
        return {k: _thaw(v) for k, v in body}
    return view


def echo_normalize(
    message: Mapping[str, object], tools: Sequence[Mapping[str, object]] | ToolDefaults | None
) -> dict[str, object]:
    """The canonical message behind `echo_view`, as plain JSON: defaults dropped, lines stripped.

    Keys come out sorted. Normalizing twice changes nothing, and a normalized message has the
    same view as the message it came from.
    """
    out = _thaw(echo_view(message, tools))
    assert isinstance(out, dict)
    return out


def _has_reasoning(message: Mapping[str, object]) -> bool:
    return any(
        isinstance(message.get(k), str) and str(message[k]).strip() for k in REASONING_FIELDS
    )


def _as_echoed(
    generated: Mapping[str, object], incoming: Mapping[str, object]
) -> Mapping[str, object]:
    """`generated` as a harness that drops reasoning would send it: without its reasoning when
    `incoming` has none. Most OpenAI-compatible clients (hermes-agent among them) never send a
    reply's reasoning back; what remains must still match in full."""
    if (
        isinstance(generated, Mapping)
        and isinstance(incoming, Mapping)
        and _has_reasoning(generated)
        and not _has_reasoning(incoming)
    ):
        return {k: v for k, v in generated.items() if k not in REASONING_FIELDS}
    return generated


def is_echo(
    generated: Mapping[str, object],
    incoming: Mapping[str, object],
    tools: Sequence[Mapping[str, object]] | ToolDefaults | None,
) -> bool:
    """True if `incoming` is `generated` re-rendered by a harness: the same `echo_view`, once
    the reasoning is left out of `generated` when `incoming` carries none."""
    if (
        isinstance(generated, Mapping)
        and isinstance(incoming, Mapping)
        and generated.get("role") != incoming.get("role")
    ):
        return False
    seen = _as_echoed(generated, incoming)
    return echo_view(seen, tools) == echo_view(incoming, tools)


def _show(view: object) -> str:
    text = repr(_thaw(view))
    return text if len(text) <= 80 else text[:77] + "..."


def _type_name(view: object) -> str:
    if isinstance(view, tuple):
        return str(view[0])
    if view is None:
        return "null"
    return {bool: "boolean", str: "string"}.get(type(view), type(view).__name__)


def _first_difference(a: object, b: object, path: str) -> str | None:
    if a == b:
        return None
    if _type_name(a) != _type_name(b):
        return f"{path}: {_type_name(a)} {_show(a)} vs {_type_name(b)} {_show(b)}"
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == _ARRAY:
        for i, (x, y) in enumerate(zip(a[1], b[1], strict=False)):
            found = _first_difference(x, y, f"{path}[{i}]")
            if found is not None:
                return found
        return f"{path}: {len(a[1])} items vs {len(b[1])} items"
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == _OBJECT:
        da, db = dict(a[1]), dict(b[1])
        for key in sorted(da.keys() | db.keys()):
            sub = f"{path}.{key}" if path else key
            if key not in db:
                return f"{sub}: only in generated ({_show(da[key])})"
            if key not in da:
                return f"{sub}: only in incoming ({_show(db[key])})"
            found = _first_difference(da[key], db[key], sub)
            if found is not None:
                return found
    return f"{path}: {_show(a)} vs {_show(b)}"


def echo_difference(
    generated: Mapping[str, object],
    incoming: Mapping[str, object],
    tools: Sequence[Mapping[str, object]] | ToolDefaults | None,
) -> str | None:
    """The first difference between two messages' views, for debug logs; None if an echo.

    Paths read like `tool_calls[0].function.arguments.old_string`; values are shown as
    normalized (defaults dropped, lines right-stripped), with keys in sorted order.
    """
    seen = _as_echoed(generated, incoming)
    return _first_difference(echo_view(seen, tools), echo_view(incoming, tools), "")
