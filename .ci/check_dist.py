"""Check what `maturin build` and `maturin sdist` wrote: one abi3 wheel for CPython 3.10+,
under the size limit, holding the package and nothing of the tests or caches; one sdist that
holds what a build from source needs.

    python .ci/check_dist.py DIST_DIR MAX_WHEEL_BYTES
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

# Never shipped: byte code, tool caches, build output; nor, in the wheel, tests and benches.
CACHES = (
    "__pycache__",
    ".pyc",
    ".pytest_cache",
    ".hypothesis",
    ".mypy_cache",
    ".ruff_cache",
    "target/",
)
FORBIDDEN = (*CACHES, "tests/", "benches/", ".ci/")
# What the installed package cannot work without.
WHEEL_NEEDS = (
    "tokentrail/__init__.py",
    "tokentrail/py.typed",
    "tokentrail/_core.pyi",
    "tokentrail/engines/default_script.json",
    "tokentrail/text/templates/qwen3.jinja",
)
SDIST_NEEDS = (
    "pyproject.toml",
    "Cargo.toml",
    "Cargo.lock",
    "rust/lib.rs",
    "python/tokentrail/__init__.py",
)


def fail(message: str) -> None:
    print(f"check_dist: {message}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    dist, limit = Path(sys.argv[1]), int(sys.argv[2])
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        fail(f"expected one wheel and one sdist in {dist}, found {wheels + sdists}")
    wheel, sdist = wheels[0], sdists[0]
    if "-cp310-abi3-" not in wheel.name:
        fail(f"{wheel.name} is not an abi3 wheel for CPython 3.10 and later")
    size = wheel.stat().st_size
    if size > limit:
        fail(f"{wheel.name} weighs {size} bytes, over the {limit} allowed")
    names = zipfile.ZipFile(wheel).namelist()
    bad = [n for n in names if any(f in n for f in FORBIDDEN)]
    if bad:
        fail(f"{wheel.name} holds what it must not: {bad[:10]}")
    cores = [n for n in names if n.startswith("tokentrail/_core") and n.endswith(".so")]
    if cores != ["tokentrail/_core.abi3.so"]:
        fail(f"{wheel.name} should hold one tokentrail/_core.abi3.so, holds {cores}")
    missing = [n for n in WHEEL_NEEDS if n not in names]
    if missing:
        fail(f"{wheel.name} lacks {missing}")
    with tarfile.open(sdist) as tar:
        members = [m.split("/", 1)[1] for m in tar.getnames() if "/" in m]
    bad = [m for m in members if any(f in m for f in CACHES)]
    missing = [n for n in SDIST_NEEDS if n not in members]
    if bad or missing:
        fail(f"{sdist.name}: holds {bad[:10]}, lacks {missing}")
    print(
        f"{wheel.name}: {size / 1e6:.2f} MB, {len(names)} files; "
        f"{sdist.name}: {sdist.stat().st_size / 1e6:.2f} MB, {len(members)} files"
    )


if __name__ == "__main__":
    main()
