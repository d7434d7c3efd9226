"""Reasoning in `<think>...</think>` tags, as each family spaces it.

The families differ only in whitespace and in who opens the block: Qwen3 writes
`<think>\\n...\\n</think>\\n\\n`, DeepSeek and GLM-4.7 close a block their prompt opened with
`...</think>`, GLM-4.5 writes `\\n<think>...</think>` itself. One class reads them all; each
instance writes one family's layout byte for byte, so parsing and re-rendering round-trip.
"""

from __future__ import annotations

from tokentrail.text.formats.base import (
    Malformed,
    ReasoningFormat,
    register_reasoning_format,
    strip_newlines,
)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class ThinkTags(ReasoningFormat):
    """A `<think>` block before the body.

    `lead` precedes `<think>` when the model opens the block itself; `inner` counts the
    newlines just inside the tags (the leading ones sit in the prompt when it opens the block);
    `after` the newlines between `</think>` and the body (only before a non-empty body when
    `after_if_body`); `always`: the block is written even without reasoning.
    """

    def __init__(
        self,
        name: str,
        *,
        lead: str = "",
        inner: tuple[int, int] = (0, 0),
        after: int = 0,
        after_if_body: bool = False,
        always: bool = False,
    ) -> None:
        super().__init__(name)
        self.lead = lead
        self.inner = inner
        self.after = after
        self.after_if_body = after_if_body
        self.always = always

    def split(self, text: str, call_start: str | None) -> tuple[str | None, str]:
        if text.lstrip().startswith(THINK_OPEN):
            start = text.index(THINK_OPEN) + len(THINK_OPEN)
            end = text.find(THINK_CLOSE, start)
            if end < 0:
                raise Malformed("unclosed <think>")
        else:
            end = text.find(THINK_CLOSE)
            # A `</think>` with no `<think>` before it: the prompt opened the block. Reasoning
            # comes before any tool call, so a `</think>` after one is argument data.
            if end < 0 or THINK_OPEN in text[:end] or (call_start and call_start in text[:end]):
                return None, text
            start = 0
        inner = strip_newlines(text[start:end], *self.inner)
        return inner, strip_newlines(text[end + len(THINK_CLOSE) :], self.after, 0)

    def wrap(self, reasoning: str | None, body: str, *, opened: bool) -> str:
        if reasoning is None and not (opened or self.always):
            return body
        lead, trail = self.inner
        opening = "" if opened else f"{self.lead}{THINK_OPEN}" + "\n" * lead
        after = "\n" * self.after if body or not self.after_if_body else ""
        return f"{opening}{reasoning or ''}" + "\n" * trail + f"{THINK_CLOSE}{after}{body}"


# Qwen3, Qwen3.5/3.6 (vLLM/SGLang `qwen3`).
QWEN3 = register_reasoning_format(ThinkTags("qwen3", inner=(1, 1), after=2))
# DeepSeek V3.1/V3.2 (`deepseek_v3`): `{reasoning}</think>{body}` after a prompt ending `<think>`.
DEEPSEEK = register_reasoning_format(ThinkTags("deepseek_v3"))
# GLM-4.5/4.6 (`glm45`): the model writes `\n<think>...</think>`, then `\n` before a body.
GLM45 = register_reasoning_format(
    ThinkTags("glm45", lead="\n", after=1, after_if_body=True, always=True)
)
# GLM-4.7 (served with `glm45` too): the prompt ends `<think>`; no whitespace at all.
GLM47 = register_reasoning_format(ThinkTags("glm47", always=True))
# Kimi K2-Thinking (`kimi_k2`): `<think>...</think>` written by the model, always.
KIMI = register_reasoning_format(ThinkTags("kimi_k2", always=True))
# MiniMax-M2 (`minimax_m2`): the prompt ends `<think>\n`; `...\n</think>\n\n`.
MINIMAX = register_reasoning_format(ThinkTags("minimax_m2", inner=(1, 1), after=2, always=True))
# Nemotron 3 (`nemotron_v3`): the prompt ends `<think>\n`; `...</think>` then the body.
NEMOTRON = register_reasoning_format(ThinkTags("nemotron_v3", inner=(1, 0), always=True))
