"""slime's own agent tests, run against slime and against tokentrail's drop-in (`make test-slime`).

    python .ci/test_slime.py /path/to/slime [--python PY] [-- PYTEST_ARGS...]

Runs slime's three agent test files twice: in the slime checkout as it is, then in a temporary
copy of it where only the `slime.agent` modules tokentrail replaces (`slime/agent/trajectory.py`,
`slime/agent/adapters/{__init__,anthropic,openai,common}.py`) are swapped for re-exports of
`tokentrail.integrations.slime`, as a slime user switching would. The checkout is never changed;
nothing of slime's is copied into this repository. Prints the slime commit and both pytest
summaries; exits non-zero when slime's own run fails.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TEST_FILES = (
    "tests/test_agent/test_adapters.py",
    "tests/test_agent/test_agent_rollout_cpu.py",
    "tests/test_agent/test_trajectory_manager_branching.py",
)

# Each replaced module becomes tokentrail's: the module object itself (`sys.modules`), so what
# a test monkeypatches on it (`common.call_sglang_generate`) is what the drop-in calls.
_ALIAS = '''"""Swapped for tokentrail's drop-in by tokentrail's `make test-slime`."""

import sys

import {module} as _dropin

sys.modules[__name__] = _dropin
'''
SWAPPED = {
    "slime/agent/trajectory.py": _ALIAS.format(module="tokentrail.integrations.slime.trajectory"),
    "slime/agent/adapters/common.py": _ALIAS.format(module="tokentrail.integrations.slime.common"),
    "slime/agent/adapters/anthropic.py": _ALIAS.format(
        module="tokentrail.integrations.slime.anthropic"
    ),
    "slime/agent/adapters/openai.py": _ALIAS.format(module="tokentrail.integrations.slime.openai"),
    "slime/agent/adapters/__init__.py": (
        '"""Swapped for tokentrail\'s drop-in by tokentrail\'s `make test-slime`."""\n\n'
        "from tokentrail.integrations.slime import AnthropicAdapter, BaseAdapter, OpenAIAdapter\n\n"
        '__all__ = ["AnthropicAdapter", "BaseAdapter", "OpenAIAdapter"]\n'
    ),
}

REPO = Path(__file__).resolve().parents[1]


def slime_commit(slime: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(slime), "log", "-1", "--format=%H %s"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "(not a git checkout)"


def run_pytest(python: str, root: Path, extra_path: list[Path], args: list[str]) -> tuple[int, str]:
    env = dict(os.environ)
    paths = [str(root), *map(str, extra_path)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TEST_FILES, *args]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def summary(output: str) -> str:
    lines = [ln.strip("= ") for ln in output.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
    return lines[-1] if lines else "(no pytest summary: see the output above)"


def dropin_copy(slime: Path, into: Path) -> Path:
    copy = into / "slime"
    shutil.copytree(slime, copy, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    for rel, text in SWAPPED.items():
        target = copy / rel
        if not target.is_file():
            raise SystemExit(f"{slime} has no {rel}: not the slime layout this swaps")
        target.write_text(text, encoding="utf-8")
    return copy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slime", type=Path, help="a slime checkout")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to test with")
    parser.add_argument("-v", "--verbose", action="store_true", help="print pytest's output")
    # What follows `--` goes to pytest as it is (argparse would not take options there).
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    opts = parser.parse_args(argv[:cut])
    opts.pytest_args = argv[cut + 1 :]
    slime = opts.slime.resolve()
    # The tests run in the checkout (and a copy of it): a relative interpreter path would not.
    python = shutil.which(opts.python) or opts.python
    python = str(Path(python).absolute())
    missing = [f for f in TEST_FILES if not (slime / f).is_file()]
    if missing:
        raise SystemExit(f"{slime} lacks {', '.join(missing)}")

    commit = slime_commit(slime)
    rc_slime, out_slime = run_pytest(python, slime, [], opts.pytest_args)
    with tempfile.TemporaryDirectory(prefix="tokentrail-slime-") as tmp:
        copy = dropin_copy(slime, Path(tmp))
        rc_dropin, out_dropin = run_pytest(
            python, copy, [REPO / "python"], ["-rf", *opts.pytest_args]
        )
    if opts.verbose:
        print(out_slime)
        print(out_dropin)
    else:
        failed = [ln for ln in out_dropin.splitlines() if ln.startswith("FAILED")]
        print("\n".join(failed))
    print(f"slime commit: {commit}")
    print(f"against slime:           {summary(out_slime)}")
    print(f"against the drop-in:     {summary(out_dropin)}")
    return rc_slime


if __name__ == "__main__":
    raise SystemExit(main())
