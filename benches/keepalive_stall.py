"""Whether the keepalive keeps a real harness waiting through a long engine stall.

Each case runs one session of a real pinned CLI (Claude Code, Codex; `tests/support/`) against
the adapter with `--engine-stream` (in this process, a thread of its own), over a stand-in
engine (`tests/support/fake_engines.py`, SGLang's or vLLM's streaming wire) that waits
`--stall` seconds before its first token, the harness's stream idle timeout set to `--idle`:

- Codex: `stream_idle_timeout_ms` of the model provider (codex-rs `ModelProviderInfo`), a
  `tokio::time::timeout` around each next SSE *event* of the Responses stream (codex-api
  `sse/responses.rs` `process_sse`): SSE comments do not reset it, events of any type do;
- Claude Code 2.1.197 (read from its bundle): a byte-level watchdog over the response body,
  `CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS` (clamped to 10 s .. 30 min), armed only for a
  first-party base URL, so `_CLAUDE_CODE_ASSUME_FIRST_PARTY_BASE_URL=1` too; bytes of any kind
  (Anthropic `ping`s) reset it. Beside it an event-level watchdog, `CLAUDE_STREAM_IDLE_TIMEOUT_MS`
  floored at 300 s by the CLI (`Math.max(value, 300000)`), fed only by the events the SDK hands
  on, which skips `ping`: no keepalive the Messages protocol has resets it, so a stall of 300 s
  or more before the first token aborts the stream whatever the adapter sends. `API_TIMEOUT_MS`
  is the SDK's `timeout`, which `fetchWithTimeout` clears once the response headers arrive (the
  adapter sends them at once): it bounds a non-streamed request only, such as the CLI's
  non-streaming fallback after a failed stream. All three are set to `--idle`. Which watchdog
  fired is read from the CLI's `--debug-file`, its retries from its `api_retry` events.

"Requests the adapter got" counts the engine calls the stand-in saw (each harness request is
one); "retries" is that less one. Each harness may retry twice (`CLAUDE_CODE_MAX_RETRIES=2`,
Codex `stream_max_retries = 2`); Claude Code also falls back to one non-streamed request.
With the adapter's keepalive (`--keepalive`, default the adapter's own `KEEPALIVE_S`) the
harness should take the reply on its first request; the control runs the same case with a
keepalive interval longer than the stall (`--control-keepalive`), where the harness gives up
or retries at its idle timeout. `--stall` takes several stalls: the default runs 300 s, at
Claude Code's event-watchdog floor, and 290 s, just under it. All cases run at once (they
mostly sleep), so a run lasts about as long as its slowest case.

    python benches/keepalive_stall.py [--stall 300,290] [--idle 60] [--keepalive 15]
        [--harnesses "claude code,codex"] [--wires sglang,vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.claude_code import CLAUDE_CODE_VERSION, install_claude_code, run_claude  # noqa: E402
from support.codex import CODEX_VERSION, install_codex, run_codex, write_home  # noqa: E402
from support.engine_thread import engine_in_thread  # noqa: E402
from support.fake_engines import FakeSGLang, FakeVLLM  # noqa: E402
from support.serve import serving_in_thread  # noqa: E402
from support.stand_in import scripted_reply  # noqa: E402
from tokentrail.adapter.http.server import Adapter, AdapterConfig  # noqa: E402
from tokentrail.adapter.protocols.sse import KEEPALIVE_S  # noqa: E402
from tokentrail.engines.sglang import SGLangEngine  # noqa: E402
from tokentrail.engines.vllm import VLLMEngine  # noqa: E402
from tokentrail.text.tokenizer import load_tokenizer  # noqa: E402

REPLY = "The plan is sound."
SCRIPT = [[{"type": "text", "text": REPLY}]]
RETRIES = 2
VERSIONS = {"claude code": CLAUDE_CODE_VERSION, "codex": CODEX_VERSION}


@dataclass
class Case:
    harness: str  # "claude code" | "codex"
    wire: str  # "sglang" | "vllm"
    stall_s: float
    keepalive_s: float
    idle_s: float


@dataclass
class Outcome:
    requests: int
    outcome: str
    trained: int | None
    generated: int | None
    wall_s: float


def run_case(case: Case, exes: dict[str, Path]) -> Outcome:
    tokenizer = load_tokenizer()
    fake_cls = FakeSGLang if case.wire == "sglang" else FakeVLLM
    fake = fake_cls(scripted_reply(SCRIPT), first_token_s=case.stall_s, tokens_per_event=1)
    sid = f"stall-{case.harness.replace(' ', '')}-{case.wire}-{case.keepalive_s:g}"
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="keepalive-stall-") as scratch:
        work = Path(scratch) / "work"
        work.mkdir()
        with engine_in_thread(fake) as stand_in:
            client = (SGLangEngine if case.wire == "sglang" else VLLMEngine)(
                stand_in.url, stream=True
            )
            adapter = Adapter(
                engine=client,
                tokenizer=tokenizer,
                config=AdapterConfig(live_stream=True, keepalive_s=case.keepalive_s),
            )
            with serving_in_thread(adapter) as (url, loop):
                took, detail = run_harness(case, exes, url, sid, work, Path(scratch))
                wall = time.monotonic() - start
                try:
                    trajectory = asyncio.run_coroutine_threadsafe(
                        adapter.finish_trajectory(sid, reward=1.0), loop
                    ).result(60)
                    trained, generated = (
                        trajectory.ledger.trained_tokens,
                        trajectory.ledger.generated_tokens,
                    )
                except Exception:  # no turn was recorded: nothing to finish
                    trained = generated = None
                asyncio.run_coroutine_threadsafe(client.close(), loop).result(30)
    path = "/generate" if case.wire == "sglang" else "/v1/completions"
    requests = len(fake.bodies(path))
    return Outcome(requests, detail, trained, generated, wall)


def run_harness(
    case: Case, exes: dict[str, Path], url: str, sid: str, work: Path, scratch: Path
) -> tuple[bool, str]:
    """Whether the harness took the reply, and what it said."""
    idle_ms = str(int(case.idle_s * 1000))
    budget = (RETRIES + 1) * (case.stall_s + case.idle_s) + 120
    if case.harness == "claude code":
        env = {
            "CLAUDE_CODE_MAX_RETRIES": str(RETRIES),
            "_CLAUDE_CODE_ASSUME_FIRST_PARTY_BASE_URL": "1",
            "CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS": idle_ms,
            "CLAUDE_STREAM_IDLE_TIMEOUT_MS": idle_ms,
            "API_TIMEOUT_MS": idle_ms,
        }
        debug = scratch / "claude-debug.txt"
        run = run_claude(
            exes["claude code"], "Check the plan.", base_url=url, session_id=sid, cwd=work,
            timeout=budget, env=env, extra_args=["--debug-file", str(debug)],
        )  # fmt: skip
        result = run.result or {}
        took = run.returncode == 0 and result.get("result") == REPLY
        said = str(result.get("result") or run.stderr.strip()[-80:] or "(nothing)")
        log = debug.read_text(errors="replace") if debug.exists() else ""
        # What gave up, from the CLI's own debug log: its event-level watchdog (not fed by
        # pings: the SDK drops them), its byte-level one, or the SDK's request timeout.
        fired = {
            "event watchdog": log.count("Streaming idle timeout: no chunks received"),
            "byte watchdog": log.count("[byte-watchdog] firing"),
        }
        why = ", ".join(f"{name} x{n}" for name, n in fired.items() if n)
        retries = sum(1 for e in run.events if e.get("subtype") == "api_retry")
        outcome = "reply taken" if took else f"gave up (exit {run.returncode}): {said[:40]}"
        return took, f"{outcome}{'; ' + why if why else ''}; {retries} api_retry events"
    home = write_home(scratch / "codex-home", url)
    config = (home / "config.toml").read_text()
    config = config.replace("stream_idle_timeout_ms = 30000", f"stream_idle_timeout_ms = {idle_ms}")
    config = config.replace("stream_max_retries = 0", f"stream_max_retries = {RETRIES}")
    (home / "config.toml").write_text(config)
    run = run_codex(
        exes["codex"], "Check the plan.", home=home, session_id=sid, cwd=work, timeout=budget
    )
    messages = [m["text"] for m in run.items("agent_message")]
    took = run.returncode == 0 and REPLY in messages
    failed = [e for e in run.events if e.get("type") == "turn.failed"]
    said = failed[-1].get("error", {}).get("message", "") if failed else run.stderr[-80:]
    if took:
        return took, "reply taken"
    return took, f"gave up (exit {run.returncode}): {' '.join(str(said).split())[:70]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--stall", default="300,290", help="seconds before the first token, comma-separated"
    )
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--keepalive", type=float, default=KEEPALIVE_S)
    parser.add_argument("--control-keepalive", type=float, default=400.0)
    parser.add_argument("--harnesses", default="claude code,codex")
    parser.add_argument("--wires", default="sglang,vllm")
    args = parser.parse_args()

    exes: dict[str, Path] = {}
    for harness in args.harnesses.split(","):
        exe = install_claude_code() if harness == "claude code" else install_codex()
        if exe is None:
            raise SystemExit(f"npm is missing: cannot install {harness}")
        exes[harness] = exe
    cases = [
        Case(harness, wire, float(stall), keepalive, args.idle)
        for stall in args.stall.split(",")
        for harness in exes
        for wire in args.wires.split(",")
        for keepalive in (args.keepalive, args.control_keepalive)
    ]
    start = time.monotonic()
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = [pool.submit(run_case, case, exes) for case in cases]
        for future in as_completed(futures):
            case = cases[futures.index(future)]
            out = future.result()
            print(f"done: {case} -> {out}", file=sys.stderr, flush=True)
        outcomes = [f.result() for f in futures]
    total = time.monotonic() - start

    print(f"a real harness through an engine stall ({args.stall} s) before the first token")
    print(
        "| harness | engine wire | stall s | keepalive s | harness idle timeout s "
        "| requests the adapter got | retries | outcome | turn trained/generated tokens "
        "| wall s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|---:|---:|")
    for case, out in zip(cases, outcomes, strict=True):
        tokens = "-" if out.generated is None else f"{out.trained}/{out.generated}"
        print(
            f"| {case.harness} {VERSIONS[case.harness]} | {case.wire} | {case.stall_s:g} "
            f"| {case.keepalive_s:g} "
            f"| {case.idle_s:g} | {out.requests} | {max(0, out.requests - 1)} | {out.outcome} "
            f"| {tokens} | {out.wall_s:.0f} |"
        )
    print()
    print(
        f"all {len(cases)} cases at once in {total:.0f} s; machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (shared with other work)"
    )


if __name__ == "__main__":
    main()
