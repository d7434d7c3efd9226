"""Install a pinned PyPI package once into a virtual environment of its own under the test
cache (`$TOKENTRAIL_CACHE/pip` or `~/.cache/tokentrail/pip`), for the real-harness tests: an
agent's dependencies (hermes-agent's top-level `agent`, `tools`, `utils`; mini-swe-agent's
litellm) never share an environment with tokentrail. Its dependencies are held at the versions
its tests last passed with, `constraints/<package>-<version>.txt` beside this file (a pin
`scripts/bump-harnesses` moves has none until its tests pass: then `pip freeze` of the new
environment is its file)."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

from support.npm import default_cache_dir

CONSTRAINTS = Path(__file__).parent / "constraints"


def pip_install(package: str, version: str, executable: str, cache_dir: Path | None = None) -> Path:
    """`pip install package==version` into `<cache>/pip/<package>-<version>/venv` once (under
    a lock, a marker written last) and return its `bin/<executable>`. Raises on a failed
    install."""
    root = cache_dir or default_cache_dir().parent / "pip" / f"{package}-{version}"
    exe, marker = root / "venv" / "bin" / executable, root / "installed"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and exe.exists():
            return exe
        # A venv cannot be moved once made, so it is made in place; the marker says it is whole.
        # Made without pip (a system Python may lack ensurepip), and filled by this Python's
        # pip, which installs into another interpreter's environment with `--python`.
        venv = root / "venv"
        subprocess.run(
            [sys.executable, "-m", "venv", "--clear", "--without-pip", str(venv)], check=True
        )
        held = CONSTRAINTS / f"{package}-{version}.txt"
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
             "--quiet", "--disable-pip-version-check", f"{package}=={version}",
             *(["-c", str(held)] if held.exists() else [])],
            capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if pip.returncode != 0 or not exe.exists():
            raise RuntimeError(f"pip install {package}=={version}: {pip.stderr[-3000:]}")
        marker.write_text(version)
    return exe
