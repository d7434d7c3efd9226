"""Install a pinned npm package once into a cache shared by test runs, for the real-harness
tests; the cache is `$TOKENTRAIL_CACHE/npm` or `~/.cache/tokentrail/npm`."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path


def default_cache_dir() -> Path:
    root = os.environ.get("TOKENTRAIL_CACHE")
    return Path(root) / "npm" if root else Path.home() / ".cache" / "tokentrail" / "npm"


def npm_install(
    package: str, version: str, name: str, find: Callable[[Path], Path | None],
    cache_dir: Path | None = None,
) -> Path | None:  # fmt: skip
    """`npm install package@version` into `<cache>/<name>` once; `find(prefix)` locates the
    executable in an install. None when npm is missing."""
    prefix = (cache_dir or default_cache_dir()) / name
    if (exe := find(prefix)) is not None:
        return exe
    npm = shutil.which("npm")
    if npm is None:
        return None
    # Install beside the target and rename into place, so concurrent test workers never see
    # a half-written install.
    prefix.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=prefix.name + ".", dir=prefix.parent))
    try:
        proc = subprocess.run(
            [npm, "install", "--prefix", str(staging), f"{package}@{version}",
             "--no-audit", "--no-fund"],
            capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"npm install {package}@{version}: {proc.stderr}")
        if find(staging) is None:
            raise RuntimeError(f"npm installed {package} but its executable is not there")
        try:
            staging.rename(prefix)
        except OSError:
            if find(prefix) is None:  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return find(prefix)
