"""slime's `slime.agent.adapters.common`, the names slime's code and tests take from it.

`TurnRecord` is tokentrail's (the same fields). `call_sglang_generate` is the one place a
drop-in adapter's turn reaches SGLang, looked up on this module at every turn as slime's is, so
a test that monkeypatches it scripts the model for the drop-in as it does for slime.
`flatten_content` reads a wire content value as text, as slime's SWE example uses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from tokentrail.engines.base import Engine, GenerateRequest
from tokentrail.trajectory.turn import TurnRecord

# Block types whose text is the block's `text`.
_TEXT_BLOCKS = frozenset({"text", "input_text", "output_text"})
_IMAGE_BLOCKS = frozenset({"image", "image_url", "input_image"})


class SGLangOwner(Protocol):
    """What `call_sglang_generate` reads of the adapter: the SGLang engine client."""

    @property
    def sglang(self) -> Engine: ...


async def call_sglang_generate(
    prompt_ids: Sequence[int],
    session: GenerateRequest,
    body: dict[str, Any],
    *,
    adapter: SGLangOwner,
    session_id: str | None = None,
) -> TurnRecord:
    """One turn on SGLang as a `TurnRecord`, with slime's signature. In the drop-in `session`
    is the turn's engine request (its sampling merges the session's defaults with the request's
    keys, as slime's merge does) and `body` the request's body."""
    gen = await adapter.sglang.generate(session)
    return TurnRecord(
        prompt_ids=list(prompt_ids),
        output_ids=gen.output_ids,
        finish_reason=gen.finish_reason,
        output_log_probs=gen.logprobs,
        routed_experts=gen.routed_experts,
        indexer_topk=gen.indexer_topk,
        weight_versions=gen.weight_versions,
    )


def flatten_content(c: Any) -> str:
    """A wire content value `c` (a string, or Anthropic or OpenAI content blocks) as one
    string: the blocks' texts joined by newlines, a tool result's content read the same way, an
    image as `[image omitted]`; anything else as `str()`."""
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if not isinstance(c, list):
        return str(c)
    return "\n".join(t for t in map(_block_text, c) if t)


def _block_text(block: Any) -> str:
    if not isinstance(block, dict):
        return block if isinstance(block, str) else str(block)
    kind = block.get("type")
    if kind in _TEXT_BLOCKS:
        return str(block.get("text", ""))
    if kind in _IMAGE_BLOCKS:
        return "[image omitted]"
    if kind == "tool_result" or "content" in block:
        return flatten_content(block.get("content"))
    if "text" in block:
        return str(block.get("text") or "")
    return ""


__all__ = ["TurnRecord", "call_sglang_generate", "flatten_content"]
