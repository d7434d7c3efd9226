"""How many bytes an engine's answer to one generation may take, computed from the request.

An answer holds the output ids and logprobs (at most `max_new_tokens` of them), the prompt ids
where the engine echoes them (vLLM's `prompt_token_ids`), and the replay rows asked for: routed
experts for the positions from the requested start, indexer top-k for every position, each
`rows x layers x top_k x 4` bytes as base64 (SGLang's rows counted from position 0: some
versions ignore the start). A margin covers the envelope and JSON escaping.
Anything longer cannot be a real answer to the request: it is refused unread.
"""

from __future__ import annotations

from tokentrail.engines.base import GenerateRequest

__all__ = ["answer_limit", "base64_len"]

# The envelope: ids, timings, finish reason, usage, weight versions, an error message.
ENVELOPE_BYTES = 1024 * 1024
# One output token: SGLang's `[logprob, id, text]` and `output_ids` entry take ~40 bytes,
# vLLM's `token_ids`, `token_logprobs`, `tokens`, `top_logprobs`, `text_offset` and its text
# ~150; a token's text escaped as `\uXXXX` a few dozen more.
OUTPUT_TOKEN_BYTES = 1024
# One echoed prompt id: up to 10 digits (ids < 2**32), a comma and a space.
PROMPT_ID_BYTES = 12
# A `.npy` header (vLLM's routed experts): 128 bytes in format 1.0, rounded up.
NPY_HEADER_BYTES = 4096
# Replay values are counted as int32 whatever the engine sends them as.
VALUE_BYTES = 4


def base64_len(n: int) -> int:
    """Characters standard padded base64 takes for `n` bytes."""
    return 4 * ((n + 2) // 3)


def answer_limit(
    req: GenerateRequest, *, echoes_prompt: bool = False, honours_start: bool = True
) -> int:
    """The most bytes a legitimate answer to `req` can take: what its tokens and replay rows
    make it, plus an eighth. `echoes_prompt`: the answer repeats the prompt ids;
    `honours_start`: routed experts come from the start asked for (else from position 0, as
    SGLang 0.5.9 to 0.5.11 send them)."""
    prompt = len(req.input_ids)
    new = max(0, req.sampling.max_new_tokens)
    size = ENVELOPE_BYTES + OUTPUT_TOKEN_BYTES * new
    if echoes_prompt:
        size += PROMPT_ID_BYTES * prompt
    # Rows come for positions fed forward: the prompt and every output token but the last.
    positions = prompt + new
    replay = req.replay
    if replay.routed_start is not None and replay.routing is not None:
        start = min(max(0, replay.routed_start), prompt) if honours_start else 0
        rows = positions - start
        routing = replay.routing
        size += NPY_HEADER_BYTES + base64_len(rows * routing.layers * routing.top_k * VALUE_BYTES)
    if replay.indexer is not None:
        indexer = replay.indexer
        size += base64_len(positions * indexer.layers * indexer.top_k * VALUE_BYTES)
    return size + size // 8
