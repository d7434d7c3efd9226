"""A request's top-level fields checked the way the official APIs check them.

Each protocol lists the fields it knows with their types, taken from the official SDKs' type
definitions (`anthropic.types.MessageCreateParams`, `openai.types.chat.CompletionCreateParams`,
`openai.types.responses.ResponseCreateParams`); a field of another type is a 400 naming it,
as the APIs answer. A field a list does not know passes (harnesses send beta fields and engine
extensions), `null` is a field left out (the SDKs send it for every `Optional`), and values whose
sets keep growing (reasoning efforts, service tiers, `include` names) are held to their type
only. A field that does not change what is generated (a display preference, a context-management
hint) is a `Hint`: a value outside the set it knows is accepted and noted (`Spec.validate`
returns where), never refused, since a harness's next release may send one. Fields that change
the prompt or the sampling stay strict. Messages and tools are checked where they are
translated, each where it is read.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

from tokentrail.errors import RequestError

__all__ = [
    "ANTHROPIC",
    "ANTHROPIC_COUNT",
    "ANTHROPIC_DEFAULTED",
    "CHAT",
    "RESPONSES",
    "Hint",
    "Spec",
    "json_content_type",
]


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


class Spec(ABC):
    """What one field may be."""

    what: str = ""

    @abstractmethod
    def accepts(self, value: object) -> bool:
        """Whether `value` has this spec's JSON type (its parts are checked by `check`)."""

    def check(self, value: object, path: str, noted: list[str]) -> None:
        """Refuse `value` (a RequestError naming `path`) unless it fits; append to `noted` the
        paths of accepted values this spec does not know (see `Hint`)."""
        if not self.accepts(value):
            raise RequestError(f"{path}: expected {self.what}, got {_kind(value)}")

    def validate(self, value: object) -> list[str]:
        """`check` a whole body: the paths of the unknown values it accepted, in order."""
        noted: list[str] = []
        self.check(value, "", noted)
        return noted


class Str(Spec):
    what = "a string"

    def accepts(self, value: object) -> bool:
        return isinstance(value, str)


class Bool(Spec):
    what = "a boolean"

    def accepts(self, value: object) -> bool:
        return isinstance(value, bool)


@dataclass
class Num(Spec):
    """A number (an integer when `integer`) within [lo, hi] where given."""

    lo: float | None = None
    hi: float | None = None
    integer: bool = False

    def __post_init__(self) -> None:
        self.what = "an integer" if self.integer else "a number"

    def accepts(self, value: object) -> bool:
        kinds: tuple[type, ...] = (int,) if self.integer else (int, float)
        return isinstance(value, kinds) and not isinstance(value, bool)

    def check(self, value: object, path: str, noted: list[str]) -> None:
        super().check(value, path, noted)
        assert isinstance(value, int | float)
        if self.lo is not None and value < self.lo:
            raise RequestError(f"{path}: must be >= {self.lo:g}, got {value}")
        if self.hi is not None and value > self.hi:
            raise RequestError(f"{path}: must be <= {self.hi:g}, got {value}")


def Int(lo: float | None = None, hi: float | None = None) -> Num:  # noqa: N802 - a spec
    return Num(lo, hi, integer=True)


@dataclass
class Enum(Spec):
    values: tuple[str, ...]

    def __post_init__(self) -> None:
        self.what = "one of " + ", ".join(json.dumps(v) for v in self.values)

    def accepts(self, value: object) -> bool:
        return isinstance(value, str) and value in self.values

    def check(self, value: object, path: str, noted: list[str]) -> None:
        if not self.accepts(value):
            raise RequestError(f"{path}: expected {self.what}, got {json.dumps(value)[:80]}")


@dataclass
class Hint(Spec):
    """A string from a set that keeps growing, of a field that does not change what is
    generated (how reasoning is displayed, say): a value outside `known` is accepted and noted,
    not refused. Claude Code 2.1.332 sends `thinking.display: "updates"`, which the API's own
    types did not list; refusing it cost every conversation two failed round trips."""

    known: tuple[str, ...]
    what: str = "a string"

    def accepts(self, value: object) -> bool:
        return isinstance(value, str)

    def check(self, value: object, path: str, noted: list[str]) -> None:
        super().check(value, path, noted)
        if value not in self.known:
            noted.append(path)


@dataclass
class Arr(Spec):
    item: Spec | None = None
    max_items: int | None = None
    what: str = "an array"

    def accepts(self, value: object) -> bool:
        return isinstance(value, list)

    def check(self, value: object, path: str, noted: list[str]) -> None:
        super().check(value, path, noted)
        assert isinstance(value, list)
        if self.max_items is not None and len(value) > self.max_items:
            raise RequestError(f"{path}: at most {self.max_items} items, got {len(value)}")
        if self.item is not None:
            for pos, item in enumerate(value):
                self.item.check(item, f"{path}[{pos}]", noted)


@dataclass
class Obj(Spec):
    """An object whose known keys have these specs; `required` keys must be present (and not
    null); other keys pass."""

    fields: Mapping[str, Spec] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    what: str = "an object"

    def accepts(self, value: object) -> bool:
        return isinstance(value, dict)

    def check(self, value: object, path: str, noted: list[str]) -> None:
        super().check(value, path, noted)
        assert isinstance(value, dict)
        for key in self.required:
            if value.get(key) is None:
                raise RequestError(f"{_join(path, key)}: Field required")
        for key, spec in self.fields.items():
            item = value.get(key)
            if item is not None:
                spec.check(item, _join(path, key), noted)


@dataclass
class Map(Spec):
    """An object with any keys, each value of one spec."""

    value: Spec
    what: str = "an object"

    def accepts(self, value: object) -> bool:
        return isinstance(value, dict)

    def check(self, value: object, path: str, noted: list[str]) -> None:
        super().check(value, path, noted)
        assert isinstance(value, dict)
        for key, item in value.items():
            self.value.check(item, f"{path}.{key}", noted)


class Either(Spec):
    """The first of `specs` whose JSON type the value has."""

    def __init__(self, *specs: Spec) -> None:
        self.specs = specs
        self.what = " or ".join(s.what for s in specs)

    def accepts(self, value: object) -> bool:
        return any(s.accepts(value) for s in self.specs)

    def check(self, value: object, path: str, noted: list[str]) -> None:
        for spec in self.specs:
            if spec.accepts(value):
                spec.check(value, path, noted)
                return
        raise RequestError(f"{path}: expected {self.what}, got {_kind(value)}")


@dataclass
class Tagged(Spec):
    """An object whose `key` (its type) picks the spec of the rest."""

    variants: Mapping[str, Obj]
    key: str = "type"
    what: str = "an object"

    def accepts(self, value: object) -> bool:
        return isinstance(value, dict)

    def check(self, value: object, path: str, noted: list[str]) -> None:
        super().check(value, path, noted)
        assert isinstance(value, dict)
        tag = value.get(self.key)
        if not isinstance(tag, str) or tag not in self.variants:
            allowed = ", ".join(json.dumps(v) for v in self.variants)
            shown = json.dumps(tag)[:80] if tag is not None else "nothing"
            raise RequestError(f"{_join(path, self.key)}: expected one of {allowed}, got {shown}")
        self.variants[tag].check(value, path, noted)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def json_content_type(headers: Mapping[str, str]) -> None:
    """A body declared as something other than JSON is refused, as the APIs refuse it; a
    request without a Content-Type is read as JSON."""
    declared = headers.get("Content-Type")
    if declared is None:
        return
    media = declared.split(";", 1)[0].strip().lower()
    if media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    ):
        return
    raise RequestError(
        f"Content-Type: {declared[:80]!r} is not JSON; send the body as application/json"
    )


# -- the fields of each protocol ------------------------------------------------------------------

_STRINGS = Arr(Str(), what="an array of strings")
_TEXT_BLOCK = Obj({"type": Enum(("text",)), "text": Str()}, required=("type", "text"))
_JSON_SCHEMA = Obj(
    {"name": Str(), "description": Str(), "schema": Obj(), "strict": Bool()}, required=("name",)
)

# How a reply's reasoning is shown: the harness's view, not what is sampled.
_DISPLAY = Hint(("summarized", "omitted"))

# anthropic.types.MessageCreateParams (count_tokens: the same without max_tokens, stream and
# the sampling keys).
_ANTHROPIC_CONTEXT: dict[str, Spec] = {
    "model": Str(),
    "messages": Arr(what="an array of messages"),
    "system": Either(Str(), Arr(_TEXT_BLOCK, what="an array of text blocks")),
    "thinking": Tagged(
        {
            "enabled": Obj(
                {"budget_tokens": Int(lo=1024), "display": _DISPLAY},
                required=("budget_tokens",),
            ),
            "disabled": Obj(),
            "adaptive": Obj({"display": _DISPLAY}),
        }
    ),
    "tool_choice": Tagged(
        {
            "auto": Obj({"disable_parallel_tool_use": Bool()}),
            "any": Obj({"disable_parallel_tool_use": Bool()}),
            "tool": Obj({"name": Str(), "disable_parallel_tool_use": Bool()}, required=("name",)),
            "none": Obj(),
        }
    ),
    "tools": Arr(Obj({"name": Str(), "description": Str(), "input_schema": Obj()})),
}
ANTHROPIC_COUNT = Obj(_ANTHROPIC_CONTEXT, required=("messages",))
ANTHROPIC = Obj(
    {
        **_ANTHROPIC_CONTEXT,
        "max_tokens": Int(lo=1),
        "metadata": Obj({"user_id": Str()}),
        "stop_sequences": _STRINGS,
        "stream": Bool(),
        "temperature": Num(0, 1),
        "top_p": Num(0, 1),
        "top_k": Int(lo=0),
        "service_tier": Enum(("auto", "standard_only")),
        "inference_geo": Str(),
        "container": Either(Str(), Obj()),
        "mcp_servers": Arr(Obj()),
        "context_management": Obj(),
        "output_config": Obj(),
        "cache_control": Obj({"type": Str()}),
    },
    required=("max_tokens", "messages"),
)
# A session a trainer opened with a `max_new_tokens` default: max_tokens may be left out.
ANTHROPIC_DEFAULTED = Obj(ANTHROPIC.fields, required=("messages",))

# openai.types.chat.CompletionCreateParams.
CHAT = Obj(
    {
        "model": Str(),
        "messages": Arr(what="an array of messages"),
        "audio": Obj(),
        "frequency_penalty": Num(-2, 2),
        "presence_penalty": Num(-2, 2),
        "function_call": Either(Enum(("none", "auto")), Obj({"name": Str()}, required=("name",))),
        "functions": Arr(Obj({"name": Str()}, required=("name",))),
        "logit_bias": Map(Num(-100, 100)),
        "logprobs": Bool(),
        "top_logprobs": Int(0, 20),
        "max_completion_tokens": Int(lo=1),
        "max_tokens": Int(lo=1),
        "metadata": Map(Str()),
        "modalities": _STRINGS,
        "n": Int(lo=1),
        "parallel_tool_calls": Bool(),
        "prediction": Obj(),
        "prompt_cache_key": Str(),
        "reasoning_effort": Str(),
        "response_format": Tagged(
            {
                "text": Obj(),
                "json_object": Obj(),
                "json_schema": Obj({"json_schema": _JSON_SCHEMA}, required=("json_schema",)),
            }
        ),
        "safety_identifier": Str(),
        "seed": Int(),
        "service_tier": Str(),
        "stop": Either(Str(), Arr(Str(), max_items=4, what="an array of strings")),
        "store": Bool(),
        "stream": Bool(),
        "stream_options": Obj({"include_usage": Bool(), "include_obfuscation": Bool()}),
        "temperature": Num(0, 2),
        "top_p": Num(0, 1),
        "tool_choice": Either(Str(), Obj()),
        "tools": Arr(Obj()),
        "user": Str(),
        "verbosity": Str(),
        "web_search_options": Obj(),
    },
    required=("messages",),
)

_TEXT_FORMAT = Tagged(
    {
        "text": Obj(),
        "json_object": Obj(),
        "json_schema": Obj(
            {"name": Str(), "description": Str(), "schema": Obj(), "strict": Bool()},
            required=("name", "schema"),
        ),
    }
)
# openai.types.responses.ResponseCreateParams.
RESPONSES = Obj(
    {
        "model": Str(),
        "input": Either(Str(), Arr(what="an array of input items")),
        "instructions": Either(Str(), Arr()),
        "background": Bool(),
        "conversation": Either(Str(), Obj()),
        "include": _STRINGS,
        "max_output_tokens": Int(lo=1),
        "max_tool_calls": Int(lo=0),
        "metadata": Map(Str()),
        "parallel_tool_calls": Bool(),
        "previous_response_id": Str(),
        "prompt": Obj(),
        "prompt_cache_key": Str(),
        "reasoning": Obj({"effort": Str(), "summary": Str(), "generate_summary": Str()}),
        "safety_identifier": Str(),
        "service_tier": Str(),
        "store": Bool(),
        "stream": Bool(),
        "stream_options": Obj({"include_obfuscation": Bool()}),
        "temperature": Num(0, 2),
        "text": Obj({"format": _TEXT_FORMAT, "verbosity": Str()}),
        "tool_choice": Either(Str(), Obj()),
        "tools": Arr(Obj()),
        "top_logprobs": Int(0, 20),
        "top_p": Num(0, 1),
        "truncation": Enum(("auto", "disabled")),
        "user": Str(),
    }
)
