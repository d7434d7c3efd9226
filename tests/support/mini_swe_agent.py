"""Run the real mini-swe-agent CLI (`mini`, from PyPI) headless against a local Chat Completions
server.

`install_mini` pip-installs the pinned release once into a virtual environment of its own
(`support.pip`); `run_mini` runs `mini -y --exit-immediately -t TASK` in its default
configuration (`mini.yaml`: one `bash` tool, the task ends when the model runs
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`) with litellm pointed at the adapter: the model
`openai/<name>`, the session id as the API key, cost tracking off (the model has no price).
"""

from __future__ import annotations

from pathlib import Path

from support.harness_versions import LATEST
from support.headless import Finished, run_headless
from support.pip import pip_install

MINI_VERSION = LATEST["mini-swe-agent"].version
PACKAGE = LATEST["mini-swe-agent"].package
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def install_mini(cache_dir: Path | None = None) -> Path:
    """Install the pinned release once and return its `mini` executable; raises on failure."""
    return pip_install(PACKAGE, MINI_VERSION, "mini", cache_dir)


def run_mini(
    exe: Path,
    task: str,
    *,
    base_url: str,
    session_id: str,
    cwd: Path,
    home: Path,
    timeout: float = 180,
    model: str = "qwen3",
) -> tuple[Finished, Path]:
    """One headless task in `cwd` with `home` as its HOME; returns the finished process and
    its trajectory file."""
    home.mkdir(parents=True, exist_ok=True)
    out = home / "trajectory.json"
    env = {
        "HOME": str(home),
        "MSWEA_GLOBAL_CONFIG_DIR": str(home / "config"),
        "MSWEA_CONFIGURED": "true",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "OPENAI_API_BASE": f"{base_url}/v1",
        "OPENAI_API_KEY": session_id,
        # litellm reads its model price map from the package, not from the network.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    argv = [
        str(exe), "-m", f"openai/{model}", "-t", task, "-y", "--exit-immediately",
        "-l", "0", "-o", str(out),
    ]  # fmt: skip
    return run_headless(argv, cwd=cwd, env=env, timeout=timeout, what="mini"), out
