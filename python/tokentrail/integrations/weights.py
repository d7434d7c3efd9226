"""New weights into a running vLLM through its own routes, while sessions are in flight.

`VLLMWeights(url).push(checkpoint_dir, version)` is what a trainer calls after a step: `POST
/pause?mode=...` (what happens to the turns being sampled: `PauseMode`), `POST /collective_rpc`
`reload_weights` from the checkpoint directory (a Hugging Face model directory, read in place by
every worker), `POST /update_weight_version`, `POST /resume`. The server needs
`VLLM_SERVER_DEV_MODE=1` for these routes; vLLM's CPU build serves them too, so the whole loop
runs on a CPU. Behind tokentrail, serve it as `vllm-tokens://`: every token then carries the
version that sampled it (`trajectory.staleness` reads them). With `PauseMode.ABORT`, the turns
in flight are aborted and tokentrail's vLLM client generates them again after the `/resume`
(`engines.abort_retry`).

On a GPU, vLLM's NCCL weight transfer (`/init_weight_transfer_engine`, `/update_weights`) and
SGLang's `update_weights_from_distributed` move the tensors without a file; they are not in
this module (`benches/gpu_closed_loop.py` drives them).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokentrail.errors import EngineError
from tokentrail.kinds import PauseMode

__all__ = ["VLLMWeights", "WeightPush"]


@dataclass(frozen=True)
class WeightPush:
    """One push: the version now served, how the in-flight turns were treated, and how long
    generation stood paused (of which `reload_s` reading the weights)."""

    version: str
    mode: PauseMode
    paused_s: float
    reload_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "mode": str(self.mode),
            "paused_s": self.paused_s,
            "reload_s": self.reload_s,
        }


class VLLMWeights:
    """vLLM's weight routes at `base_url` (a server started with `VLLM_SERVER_DEV_MODE=1`)."""

    def __init__(self, base_url: str, *, timeout_s: float = 300.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def version(self) -> str:
        """The version the server samples with now (`GET /weight_info`)."""
        answer = self._call("GET", "/weight_info")
        version = answer.get("weight_version") if isinstance(answer, dict) else None
        if not isinstance(version, str):
            raise EngineError(f"vllm at {self.base_url}: /weight_info names no weight_version")
        return version

    def name(self, version: str) -> None:
        """Name the weights served now `version` (`POST /update_weight_version`): what a
        weight transfer that names none (TRL's over NCCL) leaves to the caller."""
        self._call("POST", "/update_weight_version", {"new_version": version})

    def rpc(self, method: str, **kwargs: Any) -> Any:
        """`POST /collective_rpc`: `method` of every worker, with `kwargs` (JSON values)."""
        return self._call("POST", "/collective_rpc", {"method": method, "kwargs": kwargs})

    def push(
        self,
        weights: str | Path,
        version: str,
        *,
        mode: PauseMode = PauseMode.KEEP,
        kernel: str | Path | None = None,
    ) -> WeightPush:
        """Pause generation (`mode`), reload the weights from directory `weights`, name them
        `version`, resume. Generation resumes even when the reload fails (the error is
        raised after), so no session is left hanging on a paused engine. `kernel`: a
        directory of tensors in vLLM's own layout under its parameter names, reloaded as they
        are after `weights` (an MoE's packed experts on vLLM's CPU build:
        `vllm_experts.ExpertLayout.write`)."""
        mode = PauseMode(mode)
        start = time.perf_counter()
        self._call("POST", "/pause?" + urllib.parse.urlencode({"mode": str(mode)}))
        try:
            loaded = time.perf_counter()
            self.rpc("reload_weights", weights_path=str(weights))
            if kernel is not None:
                self.rpc("reload_weights", weights_path=str(kernel), is_checkpoint_format=False)
            reload_s = time.perf_counter() - loaded
            # The cached KV of every prefix, and of the turns held by the pause, was computed
            # by the old weights: dropped, and a held turn's context recomputed on resume, so
            # a token the new version names was sampled by the new weights over its whole
            # context (its logprob is the new policy's, as a trainer recomputes it).
            self._call("POST", "/reset_prefix_cache?reset_running_requests=true")
            self.name(version)
        finally:
            self._call("POST", "/resume")
        return WeightPush(version, mode, time.perf_counter() - start, reload_s)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps({} if body is None else body).encode() if method == "POST" else None
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            headers={"Content-Type": "application/json"},
            method=method,
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            hint = " (start vLLM with VLLM_SERVER_DEV_MODE=1)" if exc.code == 404 else ""
            raise EngineError(
                f"vllm at {self.base_url}: {method} {path} answered {exc.code}{hint}: {detail}",
                exc.code,
            ) from None
        except OSError as exc:
            raise EngineError(f"vllm at {self.base_url}: {method} {path} failed: {exc}") from None
        return json.loads(raw) if raw.strip() else None
