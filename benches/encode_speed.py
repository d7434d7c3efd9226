"""Encode speed per builtin vocabulary: the `tokenizers` package's `Tokenizer.encode` against the
Rust core's fast encoder (`IncrementalTokenizer.encode_full`) and against the core encoding
through the `tokenizers` crate (`fast_path=False`, what every encode was before the fast path).

Two texts, both from the real Claude Code traffic in `tests/fixtures`: a ~1.1 KB tail (tool
output then assistant text, what a late turn adds after its last added token) and a full prompt
of about 64K tokens (the fixture's strings, repeated). Each side's ids are checked equal first;
p50 of the repeats, in ms, and tokens per second. Build the extension in release mode first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tokentrail import _core
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer

VOCABULARIES = ["qwen3", "qwen3.6", "deepseek", "o200k_harmony", "llama3"]
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def fixture_strings() -> list[str]:
    found: list[str] = []
    for path in sorted(FIXTURES.glob("*.json")):
        found.extend(s for s in strings(json.loads(path.read_text())) if len(s) > 20)
    return found


def tail_text(found: list[str], size: int) -> str:
    """The longest fixture strings (tool output, file contents), then prose, cut to `size`."""
    longest = sorted(found, key=len, reverse=True)
    text = "\n".join(longest[:3])[: size // 2]
    prose = [s for s in found if " " in s and "{" not in s]
    text += "\n\n" + " ".join(prose)[: size - len(text) - 2]
    return text


def p50_ms(encode: Callable[[str], object], text: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        encode(text)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def measure(
    label: str,
    text: str,
    repeats: int,
    loaded: LoadedTokenizer,
    fast: _core.IncrementalTokenizer,
    slow: _core.IncrementalTokenizer,
) -> list[str]:
    def theirs(text: str) -> list[int]:
        return list(loaded.tokenizer.encode(text, add_special_tokens=False).ids)

    ids = theirs(text)
    if fast.encode_full(text).tolist() != ids or slow.encode_full(text).tolist() != ids:
        raise SystemExit(f"{loaded.name} {label}: ids differ")
    python = p50_ms(theirs, text, repeats)
    ours = p50_ms(fast.encode_full, text, repeats)
    fallback = p50_ms(slow.encode_full, text, repeats)
    return [
        loaded.name.removeprefix("builtin:"),
        f"{label} {len(text.encode()) / 1024:.1f} KB", str(len(ids)),
        f"{python:.3f}", f"{ours:.3f}", f"{fallback:.3f}",
        f"{len(ids) / ours / 1000:.2f}M", f"{python / ours:.1f}x", f"{fallback / ours:.1f}x",
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocabularies", nargs="*", default=VOCABULARIES)
    parser.add_argument("--tail-bytes", type=int, default=1100)
    parser.add_argument("--full-tokens", type=int, default=64_000)
    parser.add_argument("--repeats", type=int, default=200, help="tail repeats (full: /20)")
    args = parser.parse_args()
    found = fixture_strings()
    head = ["vocabulary", "text", "tokens", "tokenizers ms", "core fast ms", "core slow ms",
            "fast tok/s", "tokenizers/fast", "slow/fast"]  # fmt: skip
    rows = []
    for name in args.vocabularies:
        loaded = load_tokenizer(f"builtin:{name}")
        config = loaded.tokenizer.to_str()
        fast = _core.IncrementalTokenizer(config)
        slow = _core.IncrementalTokenizer(config, fast_path=False)
        if not fast.fast_path:
            print(f"{name}: no fast path ({fast.fast_path_reason})", file=sys.stderr)
        count = len(loaded.tokenizer.encode("\n".join(found), add_special_tokens=False).ids)
        full = "\n".join(["\n".join(found)] * max(1, round(args.full_tokens / count)))
        tail = tail_text(found, args.tail_bytes)
        rows.append(measure("tail", tail, args.repeats, loaded, fast, slow))
        rows.append(measure("full", full, max(5, args.repeats // 20), loaded, fast, slow))
    widths = [max(len(h), *(len(r[i]) for r in rows)) + 2 for i, h in enumerate(head)]
    print("".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for row in rows:
        print("".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    print(
        "p50 per encode; ids checked equal on every side; "
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
