"""Streaming a tool call's arguments as sampled (`text.stream_calls`): the CPU the streaming
parse spends on one turn whose call carries a long string argument (a file written whole),
fed token by token as the engine samples it, against the one whole parse every turn does anyway.

The text is what a Qwen3 model writes for the call (Hermes JSON, or Qwen3-Coder XML with the
parameter declared a string), in the pieces `StreamDecoder` gives for its real Qwen3 tokens one
at a time; the streamed side is `StreamParser.feed` per token plus its `finish` (decoding not
counted), the whole side `parse_output`. Both run
in this process; the table gives the best of `--repeat` runs.

    python benches/stream_calls.py [--sizes 2000,20000,100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any

from tokentrail.text.parsing import format_output, parse_output
from tokentrail.text.stream_parsing import StreamDecoder, StreamParser
from tokentrail.text.tokenizer import load_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Write",
            "parameters": {
                "type": "object",
                "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    }
]


def source(chars: int) -> str:
    """Python source of about `chars` characters: quotes, backslashes and newlines to escape."""
    line = 'def f{i}(x):\n    return "a\\tb" + str(x) * {i}  # é\n'
    out, i = [], 0
    while sum(map(len, out)) < chars:
        out.append(line.format(i=i))
        i += 1
    return "".join(out)[:chars]


def token_pieces(tokenizer: Any, text: str) -> list[str]:
    """`text` as the live reply's decoder hands it out, one sampled token at a time."""
    decoder = StreamDecoder(tokenizer)
    out = [decoder.feed([t]) for t in tokenizer.encode(text)]
    out.append(decoder.finish())
    assert "".join(out) == text
    return out


def best(repeat: int, run: Any) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2000,20000,100000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tokenizer = load_tokenizer("builtin:qwen3")
    print("CPU of one turn's parse (ms): streamed token by token vs the whole parse")
    print("| format | argument chars | tokens | whole | streamed | streamed / whole | µs/token |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for chars in (int(x) for x in args.sizes.split(",")):
        arguments = {"file_path": "/work/app.py", "content": source(chars)}
        call = {"type": "function", "function": {"name": "Write", "arguments": arguments}}
        message = {"role": "assistant", "content": "Writing it.", "tool_calls": [call]}
        for fmt in ("hermes", "qwen3_coder"):
            text = format_output(message, fmt, "qwen3")
            cut = token_pieces(tokenizer, text)
            whole = parse_output(text, fmt, "qwen3", tools=TOOLS)
            assert not whole.ill_formed

            def streamed(cut: list[str] = cut, fmt: str = fmt, whole: Any = whole) -> None:
                p = StreamParser(fmt, "qwen3", prompt_opens=False, tools=TOOLS)
                for piece in cut:
                    p.feed(piece)
                _, ok = p.finish(whole.message)
                assert ok

            def parsed(text: str = text, fmt: str = fmt) -> None:
                parse_output(text, fmt, "qwen3", tools=TOOLS)

            t_whole = best(args.repeat, parsed)
            t_stream = best(args.repeat, streamed)
            ratio = t_stream / t_whole if t_whole else float("inf")
            print(
                f"| {fmt} | {chars} | {len(cut)} | {t_whole * 1000:.2f} | {t_stream * 1000:.1f} "
                f"| {ratio:.0f} | {t_stream / len(cut) * 1e6:.1f} |"
            )
    print()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}, {platform.python_implementation()} {platform.python_version()}"
    )


if __name__ == "__main__":
    main()
