"""The stable-ABI (abi3) extension against a version-specific one, where calls cross the
boundary most: token-id lists and arrays into `_core`, and the fast encoder.

    python benches/abi3_boundary.py ABI3_SO NATIVE_SO [--repeats N]

Each `.so` is put into its own copy of `python/tokentrail` and timed in its own process; the
table gives the median of N runs per case (the better of alternated rounds), both sides and the
ratio (abi3 / native).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "python" / "tokentrail"

TIMING = r"""
import json, statistics, sys, time
import numpy as np
from tokentrail import _core
from tokentrail.text.tokenizer import load_tokenizer

repeats = int(sys.argv[1])
ids = list(range(131072))
other = ids[:-1] + [7]
array = np.array(ids, dtype=np.uint32)
tok = load_tokenizer("builtin:qwen3")
text = open(sys.argv[2]).read()

def median(fn):
    times = []
    for _ in range(repeats):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3

print(json.dumps({
    "common_prefix_len, two 128K-id lists": median(lambda: _core.common_prefix_len(ids, other)),
    "common_prefix_len, two 128K-id arrays": median(lambda: _core.common_prefix_len(array, array)),
    "encode, %d KB of Python source" % (len(text) // 1000): median(lambda: tok.encode(text)),
    "so": _core.__file__,
}))
"""


def run(so: Path, repeats: int, text: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "tokentrail"
        shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("_core*.so", "__pycache__"))
        shutil.copy(so, copy / so.name)
        # A build from before `_core.__version__` (main's, say) still imports.
        init = copy / "__init__.py"
        init.write_text(
            init.read_text().replace(
                "_core.__version__", 'getattr(_core, "__version__", "unknown")'
            )
        )
        out = subprocess.run(
            [sys.executable, "-c", TIMING, str(repeats), str(text)],
            capture_output=True, text=True, check=True, env={"PYTHONPATH": tmp, "PATH": ""},
        )  # fmt: skip
    result = json.loads(out.stdout)
    assert Path(result.pop("so")).name == so.name
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("abi3", type=Path)
    parser.add_argument("native", type=Path)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    text = HERE.parent / "python" / "tokentrail" / "adapter" / "server.py"
    # Alternated over rounds (the better round counts), so that a load that comes and goes on a
    # shared machine does not fall on one side only.
    rounds: list[tuple[dict[str, float], dict[str, float]]] = []
    for _ in range(args.rounds):
        rounds.append((run(args.native, args.repeats, text), run(args.abi3, args.repeats, text)))
    native = {c: min(r[0][c] for r in rounds) for c in rounds[0][0]}
    abi3 = {c: min(r[1][c] for r in rounds) for c in rounds[0][1]}
    print(
        f"abi3 ({args.abi3.name}) against native ({args.native.name}), median of {args.repeats}, "
        f"best of {args.rounds} alternated rounds, CPython {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} cores"
    )
    print("| case | native ms | abi3 ms | abi3 / native |\n|---|---|---|---|")
    for case in native:
        print(
            f"| {case} | {native[case]:.3f} | {abi3[case]:.3f} | {abi3[case] / native[case]:.2f} |"
        )


if __name__ == "__main__":
    main()
