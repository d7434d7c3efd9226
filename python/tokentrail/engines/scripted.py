"""A deterministic engine that replays a script of assistant replies, for tests and demos.

Each reply is written as the tokenizer's model family emits it (`Family.format_output`: Qwen3's
Hermes calls, Kimi's tool-call sections, gpt-oss's channels, ...), tokenized, and closed with the
stop token that family samples after it (`<|im_end|>`, GLM's `<|observation|>`, gpt-oss's
`<|call|>`); logprobs are a hash of (token id, position), so equal requests give equal turns.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import struct
import time
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from tokentrail.engines.base import GenerateRequest, Generation
from tokentrail.engines.registry import register_engine
from tokentrail.errors import EngineLimit, EngineSpecError, ScriptError
from tokentrail.text.families import Family, count_calls, resolve_family
from tokentrail.text.hf import HFTokenizer, as_loaded
from tokentrail.text.incremental import IncrementalEncoder
from tokentrail.text.tokenizer import LoadedTokenizer

logger = logging.getLogger(__name__)

FINAL_REPLY: list[dict[str, Any]] = [{"type": "text", "text": "Done."}]
LOGPROB_MIN, LOGPROB_MAX = -3.0, -0.01
BLOCK_TYPES = ("thinking", "text", "tool_use")

# default_script.json is a Claude Code session over files in the harness's working directory
# (relative paths; the harness resolves them in its cwd). Reply by reply:
#   0. thinking, text, Read{file_path: "calc.py"}
#   1. thinking, Edit{file_path: "calc.py", old_string: "    return a+b   \n",
#      new_string: "    # sum of a and b  \n    return a + b\n"}   (trailing blanks, no replace_all)
#   2. text, Write{file_path: "util.py", content with a trailing-blank line}
#   3. thinking, Bash{command: "python3 calc.py", description: "Run calc.py"}
#   4. Write{file_path: "NOTES.md", content with a trailing-blank line}
#   5. thinking, final text
# The Edit only applies if the test first writes CALC_PY to calc.py in the harness's cwd: its
# old_string must occur exactly once in the file Claude Code has read.
CALC_PY = "def add(a, b):\n    return a+b   \n\nprint(add(1, 2))\n"
DEFAULT_SCRIPT_FILES = {"calc.py": CALC_PY}


def load_script(source: str | os.PathLike[str] | Sequence[Any] | None = None) -> list[list[dict]]:
    """The replies of `source`: a JSON file, an already-loaded list, or None for the default."""
    if source is None:
        text = resources.files("tokentrail.engines").joinpath("default_script.json").read_text()
        data: Any = json.loads(text)
    elif isinstance(source, str | os.PathLike):
        try:
            data = json.loads(Path(source).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ScriptError(f"cannot read script {os.fspath(source)!r}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise ScriptError(f"script {os.fspath(source)!r} is not JSON: {exc}") from None
    else:
        data = source
    return _validate(data)


def _validate(data: Any) -> list[list[dict]]:
    if not isinstance(data, list):
        raise ScriptError("a script is a JSON list of replies")
    for i, reply in enumerate(data):
        if not isinstance(reply, list):
            raise ScriptError(f"reply {i} is not a list of content blocks")
        for j, block in enumerate(reply):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in BLOCK_TYPES:
                raise ScriptError(f"reply {i} block {j}: type must be one of {BLOCK_TYPES}")
            if kind == "tool_use":
                if not isinstance(block.get("name"), str) or not isinstance(
                    block.get("input", {}), dict
                ):
                    raise ScriptError(f"reply {i} block {j}: tool_use needs a name and an input")
            elif not isinstance(block.get(kind), str):
                raise ScriptError(f"reply {i} block {j}: {kind} needs a string {kind!r}")
    return [list(reply) for reply in data]


def blocks_to_message(blocks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The assistant message of Anthropic-style content blocks, in chat-template form."""
    thinking = [b["thinking"] for b in blocks if b["type"] == "thinking"]
    texts = [b["text"] for b in blocks if b["type"] == "text"]
    calls = [
        {"type": "function", "function": {"name": b["name"], "arguments": dict(b.get("input", {}))}}
        for b in blocks
        if b["type"] == "tool_use"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts)}
    if thinking:
        message["reasoning_content"] = "\n\n".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


@functools.lru_cache(maxsize=1 << 16)
def scripted_logprob(token_id: int, position: int) -> float:
    """A logprob in [-3, -0.01] fixed by (token id, position), exactly representable in float32."""
    digest = hashlib.blake2b(f"{token_id}:{position}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2**64
    value = LOGPROB_MIN + (LOGPROB_MAX - LOGPROB_MIN) * u
    # Engines report float32 logprobs; matching that keeps round-trips through float32 exact.
    return struct.unpack("<f", struct.pack("<f", value))[0]


class ScriptedEngine:
    """Replies from a script: reply N answers a prompt holding N assistant messages.

    Counting the prompt's assistant messages (not calls) makes a retried or replayed request get
    the same reply. Past the end of the script every reply is a short final "Done.".

    A script cannot be steered, so a constraint (a forced tool call) is honoured only by
    checking it: a scripted reply that does not match is refused with `EngineLimit`.
    """

    name = "scripted"
    supports_constraints = True
    # Reads the messages, not the pixels: a prompt with images is served as any other.
    supports_images = True

    def __init__(
        self,
        tokenizer: LoadedTokenizer | HFTokenizer,
        script: str | os.PathLike[str] | Sequence[Any] | None = None,
        family: Family | None = None,
    ) -> None:
        self.tokenizer = tokenizer = as_loaded(tokenizer)
        # The core's encoder (the same ids as `tokenizer.encode`), so that a benchmark's
        # scripted engine costs the process it shares as little as it can.
        self.encoder = IncrementalEncoder(tokenizer)
        self.replies = load_script(script)
        self.family = family or resolve_family(tokenizer)

    def end_id(self, message: Mapping[str, Any]) -> int:
        """The stop token the family's model samples after `message` (the eos token when the
        vocabulary lacks it)."""
        end = self.tokenizer.added_tokens.get(self.family.end_token(message))
        return self.tokenizer.eos_token_id if end is None else end

    def reply_index(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant")

    def reply_blocks(self, index: int) -> list[dict[str, Any]]:
        return self.replies[index] if index < len(self.replies) else FINAL_REPLY

    def reply_text(self, index: int) -> str:
        """The text the model emits for reply `index`, end-of-turn token excluded."""
        message = self.family.representable(blocks_to_message(self.reply_blocks(index)))
        return self.family.format_output(message)

    def choose(self, req: GenerateRequest) -> list[dict[str, Any]]:
        """The content blocks to answer `req` with."""
        return self.reply_blocks(self.reply_index(req.messages))

    def message_for(self, req: GenerateRequest) -> dict[str, Any]:
        """The assistant message to answer `req` with, as the family's format carries it."""
        return dict(self.family.representable(blocks_to_message(self.choose(req))))

    def write(self, message: Mapping[str, Any], req: GenerateRequest) -> str:
        """What the model writes for `message` in answer to `req`, end-of-turn token excluded."""
        return self.family.format_output(message, call_index=count_calls(req.messages))

    async def generate(self, req: GenerateRequest) -> Generation:
        start = time.perf_counter()
        message = self.message_for(req)
        text = self.write(message, req)
        if req.constraint is not None and re.fullmatch(req.constraint.regex, text) is None:
            raise EngineLimit(
                f"the {self.name} engine replays its script and cannot constrain it: reply "
                f"{self.reply_index(req.messages)} is not {req.constraint.wants}"
            )
        ids = [*self.encoder.encode_full(text).tolist(), self.end_id(message)]
        finish = "stop"
        cut = self._stop_cut(ids[:-1], text, req.sampling.stop)
        if cut is not None:
            ids = ids[:cut]  # a stop string ends the turn on the token that completes it
        if len(ids) > req.sampling.max_new_tokens:
            ids = ids[: req.sampling.max_new_tokens]
            finish = "length"
        logprobs = [scripted_logprob(t, i) for i, t in enumerate(ids)]
        logger.debug("%s: %d tokens for session %s", self.name, len(ids), req.session_id)
        routed, indexer = req.replay.unsupported()
        elapsed = time.perf_counter() - start
        return Generation(ids, logprobs, finish, len(req.input_ids), elapsed, routed, indexer)

    def _stop_cut(self, ids: list[int], text: str, stops: Sequence[str]) -> int | None:
        if not any(s and s in text for s in stops):
            return None
        for k in range(1, len(ids) + 1):
            prefix = self.tokenizer.decode(ids[:k])
            if any(s and s in prefix for s in stops):
                return k
        return None

    async def abort(self, request_id: str) -> None:
        """Nothing runs long enough to abort."""

    async def close(self) -> None:
        """Nothing to release."""


@register_engine("scripted", "scripted, scripted:FILE")
def _from_spec(
    spec: str, address: str, tokenizer: LoadedTokenizer, timeout: float
) -> ScriptedEngine:
    if spec.startswith("scripted:") and not address:
        raise EngineSpecError("scripted:FILE needs a file name")
    return ScriptedEngine(tokenizer, address or None)
