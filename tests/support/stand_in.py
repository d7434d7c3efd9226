"""A stand-in engine's model for the real-harness tests: reply N to a prompt holding N
assistant turns, as Qwen3 writes it (the scripted engine's rule, read from the prompt's ids:
an engine sees only those)."""

from __future__ import annotations

from typing import Any

from tokentrail.engines.scripted import ScriptedEngine, scripted_logprob
from tokentrail.text.tokenizer import load_tokenizer


def scripted_reply(script: list) -> Any:
    tokenizer = load_tokenizer()
    engine = ScriptedEngine(tokenizer, script)
    im_end = tokenizer.token_id("<|im_end|>")

    def reply(prompt_ids: list[int]) -> tuple[list[int], list[float], str]:
        turns = tokenizer.decode(prompt_ids).count("<|im_start|>assistant") - 1
        ids = [*tokenizer.encode(engine.reply_text(turns)), im_end]
        return ids, [scripted_logprob(t, i) for i, t in enumerate(ids)], "stop"

    return reply
