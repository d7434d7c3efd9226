"""Model families: which parsers, template, stop tokens and vocabulary belong together.

A `Family` names a model family's tool-call and reasoning formats (`text.formats`), its chat
template (tokentrail's own rendition of the family's documented format, in `templates/`), the
tokens it stops on, and the tokens its vocabulary adds, so `--tokenizer builtin:NAME` can pick
all of them at once and a model directory's own template can be matched to its parsers. Each
family registers itself; `detect_family` tries them in registration order (most specific first).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Protocol

from tokentrail.errors import TokenizerError
from tokentrail.messages import Message
from tokentrail.text.formats.base import function_of, reasoning_of, text_of
from tokentrail.text.parsing import format_output

logger = logging.getLogger(__name__)

# Added tokens as (content, special): `special` tokens are dropped by `skip_special_tokens`.
Tokens = tuple[tuple[str, bool], ...]


@dataclass(frozen=True)
class Family:
    """A model family's output formats, template, end-of-turn tokens and vocabulary."""

    name: str
    description: str
    tool_parser: str
    reasoning_parser: str | None
    # A file in tokentrail/text/templates.
    template_file: str
    # Every token that ends a sampled turn (the engine's stop set), eos first.
    stop_tokens: tuple[str, ...]
    # The stop token the model samples after a message with calls, and after one without.
    end_after_calls: str
    end_after_text: str
    # The family's added tokens, for a stand-in vocabulary; specials the templates use.
    tokens: Tokens = ()
    bos_token: str | None = None
    pad_token: str | None = None
    # The builtin vocabulary (`text.vocabularies`) the family's models use, if one ships.
    vocabulary: str | None = None
    # Substrings that all occur in a chat template of this family.
    markers: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    # The generation prompt opens the reasoning block (ends with `<think>`).
    prompt_opens_reasoning: bool = False
    # A sampled end token that the template writes as another token in history.
    history_end: Mapping[str, str] = field(default_factory=dict)
    # How tool-call ids are minted for templates that render them.
    call_id: str = "call_{index}"
    # What the format can carry: reasoning at all, text and calls together, how many calls;
    # which texts the template strips. `always_reasoning`: the template writes the reasoning
    # block with or without reasoning, so empty reasoning is no reasoning.
    reasoning: bool = True
    text_with_calls: bool = True
    max_calls: int | None = None
    strip_content: bool = False
    strip_reasoning: bool = False
    always_reasoning: bool = False
    # The vision encoder (`text.vision.vision_spec`) whose image tokens the family's prompts
    # hold; None: images render as `[image]`.
    vision: str | None = None
    # The `model_type`s of the checkpoints (config.json) that speak this family: a model
    # directory of one is this family whatever its chat template matches (a Qwen2.5-VL's
    # template is Qwen3's, but its prompts hold image tokens).
    model_types: tuple[str, ...] = ()

    @property
    def eos_token(self) -> str:
        return self.stop_tokens[0]

    def template(self) -> str:
        """The family's chat template (tokentrail's rendition of its documented format)."""
        path = resources.files("tokentrail.text").joinpath("templates").joinpath(self.template_file)
        return path.read_text("utf-8")

    def end_token(self, message: Mapping[str, Any]) -> str:
        """The stop token the model samples after `message`."""
        return self.end_after_calls if message.get("tool_calls") else self.end_after_text

    def representable(self, message: Mapping[str, Any]) -> Message:
        """`message` as this family's format carries it: what a model of the family could
        have written, and what parsing its output gives back."""
        out: dict[str, Any] = {"role": "assistant"}
        content = text_of(message.get("content"))
        calls = [_plain_call(c) for c in message.get("tool_calls") or ()]
        if self.max_calls is not None:
            calls = calls[: self.max_calls]
        if calls and not self.text_with_calls:
            content = ""
        out["content"] = content.strip() if self.strip_content else content
        reasoning = reasoning_of(message) if self.reasoning else None
        if reasoning is not None and self.strip_reasoning:
            reasoning = reasoning.strip()
        if self.always_reasoning and not reasoning:
            reasoning = None
        if reasoning is not None:
            out["reasoning_content"] = reasoning
        if calls:
            out["tool_calls"] = calls
        return out  # type: ignore[return-value]  # built key by key

    def canonical(self, message: Message) -> Message:
        """A parsed `message` as the template sees it: empty reasoning dropped where the
        template writes the block anyway (the wire protocols drop it too)."""
        if self.always_reasoning and message.get("reasoning_content") == "":
            trimmed = dict(message)
            del trimmed["reasoning_content"]
            return trimmed  # type: ignore[return-value]  # a Message less one key
        return message

    def format_output(
        self, message: Mapping[str, Any], *, call_index: int = 0, compact: bool = False
    ) -> str:
        """The text a model of this family writes for `message`, stop token excluded."""
        return format_output(
            message,
            self.tool_parser,
            self.reasoning_parser,
            opened=self.prompt_opens_reasoning,
            call_index=call_index,
            compact=compact,
        )


def _plain_call(call: Mapping[str, Any]) -> dict[str, Any]:
    name, arguments = function_of(call)
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


_FAMILIES: dict[str, Family] = {}
_NAMES: dict[str, str] = {}


def register_family(family: Family) -> Family:
    """Make `family` available under its name and aliases; the order is detection order."""
    _FAMILIES[family.name] = family
    for name in (family.name, *family.aliases):
        _NAMES[name] = family.name
    return family


def family(name: str) -> Family:
    try:
        return _FAMILIES[_NAMES[name]]
    except KeyError:
        raise TokenizerError(f"unknown model family {name!r}; known: {family_list()}") from None


def families() -> list[Family]:
    return list(_FAMILIES.values())


def family_list() -> str:
    return ", ".join(_FAMILIES)


def model_type_family(model_type: object) -> Family | None:
    """The family whose checkpoints have `model_type` (config.json's), or None."""
    for candidate in _FAMILIES.values():
        if model_type in candidate.model_types:
            return candidate
    return None


def detect_family(template: str) -> Family | None:
    """The first family whose markers all occur in `template`, or None."""
    for candidate in _FAMILIES.values():
        if candidate.markers and all(marker in template for marker in candidate.markers):
            return candidate
    return None


class TokenizerFamily(Protocol):
    """What `resolve_family` reads of a tokenizer (`text.tokenizer.LoadedTokenizer`)."""

    @property
    def chat_template(self) -> str: ...

    @property
    def eos_token(self) -> str: ...

    @property
    def family(self) -> str | None: ...


def resolve_family(
    tokenizer: TokenizerFamily, template: str | None = None, name: str | None = None
) -> Family:
    """The family whose parsers and end tokens go with `tokenizer` rendered with `template`.

    An explicit `name` wins; then the family a template override matches; then the tokenizer's
    own (a builtin's, or the one its model directory's template matched). Without any, Qwen3's
    parsers with the tokenizer's eos token as the end of every turn (tokentrail's defaults).
    """
    if name is not None:
        return family(name)
    if template is not None and template != tokenizer.chat_template:
        found = detect_family(template)
        if found is not None:
            return found
    if tokenizer.family is not None:
        return family(tokenizer.family)
    found = detect_family(tokenizer.chat_template)
    if found is not None:
        return found
    eos = tokenizer.eos_token
    return dataclasses.replace(
        QWEN3, name="unmatched", stop_tokens=(eos,), end_after_calls=eos, end_after_text=eos
    )


def count_calls(messages: Sequence[Mapping[str, Any]]) -> int:
    """How many tool calls `messages` hold (Kimi numbers a conversation's calls from 0)."""
    return sum(len(m.get("tool_calls") or ()) for m in messages if m.get("role") == "assistant")


# --- the families, most specific markers first --------------------------------------------------

# Token groups several families' vocabularies add, each said once.
_THINK_TOKENS: Tokens = (("<think>", False), ("</think>", False))
_TOOL_TAG_TOKENS: Tokens = (
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
)
_IM_END = "<|im_end|>"
_QWEN_TOKENS: Tokens = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    (_IM_END, True),
    *_TOOL_TAG_TOKENS,
    *_THINK_TOKENS,
)
_IM_STOPS = (_IM_END, "<|endoftext|>")
_DEEPSEEK_BOS, _DEEPSEEK_EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
_DEEPSEEK_TOKENS: Tokens = (
    (_DEEPSEEK_BOS, True),
    (_DEEPSEEK_EOS, True),
    ("<｜User｜>", False),
    ("<｜Assistant｜>", False),
    *_THINK_TOKENS,
)

register_family(
    Family(
        name="gpt-oss",
        description="gpt-oss in OpenAI's harmony format (analysis/commentary/final channels)",
        tool_parser="harmony",
        reasoning_parser="harmony",
        template_file="gpt_oss.jinja",
        stop_tokens=("<|return|>", "<|call|>", "<|endoftext|>"),
        end_after_calls="<|call|>",
        end_after_text="<|return|>",
        vocabulary="o200k_harmony",
        markers=("<|channel|>", "<|message|>"),
        aliases=("harmony",),
        history_end={"<|return|>": "<|end|>"},
        max_calls=1,
    )
)
register_family(
    Family(
        name="llama3",
        description="Llama 3.1/3.2/3.3 with JSON tool calls",
        tool_parser="llama3_json",
        reasoning_parser=None,
        template_file="llama3_1.jinja",
        stop_tokens=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
        end_after_calls="<|eot_id|>",
        end_after_text="<|eot_id|>",
        bos_token="<|begin_of_text|>",
        vocabulary="llama3",
        markers=("<|start_header_id|>", "Cutting Knowledge Date"),
        aliases=("llama3.1", "llama3.2", "llama3.3"),
        history_end={"<|eom_id|>": "<|eot_id|>"},
        reasoning=False,
        text_with_calls=False,
        max_calls=1,
        strip_content=True,
    )
)
register_family(
    Family(
        name="deepseek-v3.2",
        description="DeepSeek V3.2: DSML tool calls, thinking mode",
        tool_parser="deepseek_v32",
        reasoning_parser="deepseek_v3",
        template_file="deepseek_v3_2.jinja",
        stop_tokens=(_DEEPSEEK_EOS,),
        end_after_calls=_DEEPSEEK_EOS,
        end_after_text=_DEEPSEEK_EOS,
        tokens=(*_DEEPSEEK_TOKENS, ("｜DSML｜", False)),
        bos_token=_DEEPSEEK_BOS,
        vocabulary="deepseek",
        markers=("｜DSML｜",),
        aliases=("deepseek",),
        prompt_opens_reasoning=True,
        always_reasoning=True,
    )
)
register_family(
    Family(
        name="deepseek-v3.1",
        description="DeepSeek V3.1: special-token tool calls, non-thinking mode",
        tool_parser="deepseek_v31",
        reasoning_parser="deepseek_v3",
        template_file="deepseek_v3_1.jinja",
        stop_tokens=(_DEEPSEEK_EOS,),
        end_after_calls=_DEEPSEEK_EOS,
        end_after_text=_DEEPSEEK_EOS,
        tokens=(
            *_DEEPSEEK_TOKENS,
            ("<｜tool▁calls▁begin｜>", False),
            ("<｜tool▁calls▁end｜>", False),
            ("<｜tool▁call▁begin｜>", False),
            ("<｜tool▁call▁end｜>", False),
            ("<｜tool▁sep｜>", False),
            ("<｜tool▁output▁begin｜>", False),
            ("<｜tool▁output▁end｜>", False),
        ),
        bos_token=_DEEPSEEK_BOS,
        vocabulary="deepseek",
        markers=("<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>"),
        aliases=("deepseek-v3.1-terminus",),
        # Non-thinking mode (the template's default): the card supports calls only there.
        reasoning=False,
    )
)
_GLM_TOKENS: Tokens = (
    ("<|endoftext|>", True),
    ("[gMASK]", True),
    ("<sop>", True),
    ("<|system|>", True),
    ("<|user|>", True),
    ("<|assistant|>", True),
    ("<|observation|>", True),
    *_THINK_TOKENS,
    *_TOOL_TAG_TOKENS,
    ("<arg_key>", False),
    ("</arg_key>", False),
    ("<arg_value>", False),
    ("</arg_value>", False),
)
_GLM_STOPS = ("<|endoftext|>", "<|user|>", "<|observation|>")
register_family(
    Family(
        name="glm4.7",
        description="GLM-4.7: compact <arg_key>/<arg_value> calls, prompt-opened reasoning",
        tool_parser="glm47",
        reasoning_parser="glm47",
        template_file="glm4_7.jinja",
        stop_tokens=_GLM_STOPS,
        end_after_calls="<|observation|>",
        end_after_text="<|user|>",
        tokens=_GLM_TOKENS,
        markers=("<arg_key>", "</arg_key><arg_value>"),
        prompt_opens_reasoning=True,
        strip_content=True,
        strip_reasoning=True,
        always_reasoning=True,
    )
)
register_family(
    Family(
        name="glm4.5",
        description="GLM-4.5/4.6: <tool_call>NAME with <arg_key>/<arg_value> pairs",
        tool_parser="glm45",
        reasoning_parser="glm45",
        template_file="glm4_5.jinja",
        stop_tokens=_GLM_STOPS,
        end_after_calls="<|observation|>",
        end_after_text="<|user|>",
        tokens=_GLM_TOKENS,
        markers=("<arg_key>", "<|observation|>"),
        aliases=("glm4.6",),
        strip_content=True,
        strip_reasoning=True,
        always_reasoning=True,
    )
)
_KIMI_TOKENS: Tokens = (
    ("[BOS]", True),
    ("[EOS]", True),
    (_IM_END, True),
    ("<|im_user|>", True),
    ("<|im_assistant|>", True),
    ("<|im_system|>", True),
    ("<|im_middle|>", True),
    ("<|tool_calls_section_begin|>", False),
    ("<|tool_calls_section_end|>", False),
    ("<|tool_call_begin|>", False),
    ("<|tool_call_argument_begin|>", False),
    ("<|tool_call_end|>", False),
    *_THINK_TOKENS,
)
# Kimi K2.5's image placeholder tokens (`text.vision`), special like the turn markers.
_KIMI_MEDIA_TOKENS: Tokens = (
    ("<|media_begin|>", True),
    ("<|media_content|>", True),
    ("<|media_end|>", True),
    ("<|media_pad|>", True),
)
register_family(
    Family(
        name="kimi-k2.5",
        description="Kimi K2.5/K2.6: K2's calls, a prompt that opens the think block",
        tool_parser="kimi_k2",
        reasoning_parser="kimi_k2",
        template_file="kimi_k2_5.jinja",
        stop_tokens=(_IM_END,),
        end_after_calls=_IM_END,
        end_after_text=_IM_END,
        tokens=_KIMI_TOKENS + _KIMI_MEDIA_TOKENS,
        markers=("<|tool_calls_section_begin|>", "tools_ts_str"),
        aliases=("kimi-k2.6",),
        vision="kimi-k2.5",
        call_id="functions.{name}:{index}",
        prompt_opens_reasoning=True,
        always_reasoning=True,
    )
)
register_family(
    Family(
        name="kimi-k2",
        description="Kimi K2 (thinking): a tool-call section of functions.NAME:IDX calls",
        tool_parser="kimi_k2",
        reasoning_parser="kimi_k2",
        template_file="kimi_k2.jinja",
        stop_tokens=(_IM_END,),
        end_after_calls=_IM_END,
        end_after_text=_IM_END,
        tokens=_KIMI_TOKENS,
        markers=("<|tool_calls_section_begin|>",),
        aliases=("kimi-k2-thinking",),
        call_id="functions.{name}:{index}",
        always_reasoning=True,
    )
)
register_family(
    Family(
        name="minimax-m2",
        description="MiniMax-M2/M2.1/M2.5: <minimax:tool_call> blocks of <invoke> elements",
        tool_parser="minimax_m2",
        reasoning_parser="minimax_m2",
        template_file="minimax_m2.jinja",
        stop_tokens=("[e~[",),
        end_after_calls="[e~[",
        end_after_text="[e~[",
        tokens=(
            ("]!d~[", True),
            ("]~!b[", True),
            ("]~b]", True),
            ("[e~[", True),
            *_THINK_TOKENS,
            ("<minimax:tool_call>", False),
            ("</minimax:tool_call>", False),
        ),
        bos_token="]~!b[",
        markers=("<minimax:tool_call>",),
        aliases=("minimax-m2.1", "minimax-m2.5"),
        prompt_opens_reasoning=True,
        always_reasoning=True,
    )
)
register_family(
    Family(
        name="nemotron3",
        description="Nemotron 3: Qwen3-Coder-style calls, ChatML, prompt-opened reasoning",
        tool_parser="nemotron3",
        reasoning_parser="nemotron_v3",
        template_file="nemotron3.jinja",
        stop_tokens=_IM_STOPS,
        end_after_calls=_IM_END,
        end_after_text=_IM_END,
        tokens=_QWEN_TOKENS,
        pad_token="<|endoftext|>",
        markers=("<function=", "truncate_history_thinking"),
        aliases=("nemotron-3",),
        prompt_opens_reasoning=True,
        strip_content=True,
        always_reasoning=True,
    )
)
register_family(
    Family(
        name="qwen3.6",
        description="Qwen3.5/Qwen3.6: Qwen3-Coder XML calls, the 248K vocabulary",
        tool_parser="qwen3_coder",
        reasoning_parser="qwen3",
        template_file="qwen3_6.jinja",
        stop_tokens=_IM_STOPS,
        end_after_calls=_IM_END,
        end_after_text=_IM_END,
        tokens=_QWEN_TOKENS,
        pad_token="<|endoftext|>",
        vocabulary="qwen3.6",
        markers=("<function=", "<parameter=", "<think>"),
        aliases=("qwen3.5",),
        vision="qwen3-vl",
        prompt_opens_reasoning=True,
        strip_content=True,
        strip_reasoning=True,
        always_reasoning=True,
    )
)
QWEN3 = register_family(
    Family(
        name="qwen3",
        description="Qwen2.5/Qwen3: Hermes JSON calls in <tool_call> blocks",
        tool_parser="hermes",
        reasoning_parser="qwen3",
        template_file="qwen3.jinja",
        stop_tokens=_IM_STOPS,
        end_after_calls=_IM_END,
        end_after_text=_IM_END,
        tokens=_QWEN_TOKENS,
        pad_token="<|endoftext|>",
        vocabulary="qwen3",
        markers=("<tool_call>", "<|im_start|>"),
        aliases=("qwen2.5", "hermes"),
    )
)
# Qwen's vision-language models: Qwen3's format and vocabulary with image tokens. Registered
# after Qwen3 with its markers, so a template is matched to Qwen3; they are picked by name.
register_family(
    dataclasses.replace(
        QWEN3,
        name="qwen3-vl",
        description="Qwen3-VL: Qwen3's format, images as 16-pixel-patch vision tokens",
        aliases=(),
        vision="qwen3-vl",
        model_types=("qwen3_vl", "qwen3_vl_moe"),
    )
)
register_family(
    dataclasses.replace(
        QWEN3,
        name="qwen2.5-vl",
        description="Qwen2-VL/Qwen2.5-VL: Qwen2.5's format, images as 14-pixel-patch tokens",
        aliases=("qwen2-vl",),
        vision="qwen2-vl",
        model_types=("qwen2_vl", "qwen2_5_vl"),
    )
)
