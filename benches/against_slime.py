"""tokentrail next to slime's own agent pipeline, on the same recorded sessions.

The sessions (`sessions.py`): a Claude-Code-like harness with Claude Code's real tool list and
echo rewrites, 128 turns growing to about 64K prompt tokens, one Bash/Edit/Read/Write call and
about 1,000 characters of tool output per turn; the raw request bodies are kept as sent.

Per turn, both sides start from the body bytes and end with the turn recorded:
- slime: `json.loads`, the request translated to chat messages, transformers'
  `apply_chat_template(tokenize=True)` (jinja render and a full encode with the same
  `tokenizers` vocabulary), then slime's `TrajectoryManager.record_turn`; finish is its
  `get_trajectory`. This is slime's agent-adapter path (`slime/agent/adapters/common.py`).
- tokentrail: the adapter's own steps in process (`sessions.replay_in_process`): its request
  reader (the body parsed and translated where it differs from the session's previous one),
  `TurnPipeline.prepare` (echo restore, splice or incremental render) and `.record`; finish is
  `TrajectoryManager.finish`. The splice checks the adapter defers until after the reply are
  timed apart ("after reply").
The sampled outputs and their parsed messages are computed once, outside the timings.
Memory is what the session holds before finish (Python allocations, tracemalloc, plus the Rust
store's buffers); for tokentrail that includes the adapter's copy of the session's latest request.
Each side is measured in a process of its own; then (`--alternating` runs) both in one
process, each turn timed on one side then the other and finish by finish, so that what the
machine's load does to one side it does to the other (their sessions then share a heap).

    python benches/against_slime.py --slime PATH_TO_A_SLIME_CHECKOUT [--turns 128 --context 65536]

The bench does not vendor slime: without `--slime` it says how to get a checkout.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import logging
import multiprocessing
import os
import pstats
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
from report import Report, machine
from sessions import (
    RecordedTurn,
    Sampled,
    claude_code_tools,
    parsed_replies,
    record_session,
    replay_in_process,
)

from tokentrail.adapter.protocols.anthropic import AnthropicMessages
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer

PROTOCOL = AnthropicMessages()


def run_tokentrail(tokenizer: LoadedTokenizer, turns: list[RecordedTurn], replies: list) -> dict:
    costs = replay_in_process(tokenizer, turns, replies)
    assert costs.adapter is not None
    manager = costs.adapter.manager
    session = manager._sessions.get("s")  # noqa: SLF001 - put back to time finish again

    def prime() -> None:
        manager._sessions["s"] = session  # noqa: SLF001 - finish consumes it; reading it does not

    return {
        "times": costs.totals(),
        "after": costs.after,
        "prime": prime,
        "finish": lambda: manager.finish("s"),
        "manager": manager,
        "adapter": costs.adapter,
    }


def run_slime(tokenizer: LoadedTokenizer, turns: list[RecordedTurn], replies: list) -> dict:
    side = _slime_stepper(tokenizer, turns, replies)
    times = []
    for k in range(len(turns)):
        start = time.perf_counter()
        side["step"](k)
        times.append(time.perf_counter() - start)
    # `get_trajectory` consumes the session (it pops it and marks each turn trained): `prime`
    # puts it back as it was to time it again.
    side["freeze"]()
    return {"times": times, **side}


def _slime_stepper(tokenizer: LoadedTokenizer, turns: list, replies: list) -> dict:
    """slime's side one turn at a time (`step(k)`), and its finish: `freeze` keeps the
    session as it stands, which `prime` puts back before each timed finish."""
    from slime.agent.trajectory import TrajectoryManager as SlimeManager
    from slime.agent.trajectory import TurnRecord as SlimeTurn
    from slime.utils.types import Sample as SlimeSample
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.tokenizer,
        chat_template=tokenizer.chat_template,
        eos_token=tokenizer.eos_token,
        pad_token=tokenizer.pad_token,
    )
    manager = SlimeManager()

    def step(k: int) -> None:
        turn, reply = turns[k], replies[k]
        conversation = PROTOCOL.translate(json.loads(turn.body))
        messages = [dict(m) for m in conversation.messages]
        tools = [dict(t) for t in conversation.tools or []] or None
        prompt_ids = hf.apply_chat_template(
            messages, tools=tools, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        manager.record_turn(
            "s",
            turn=SlimeTurn(list(prompt_ids), turn.output_ids, turn.finish_reason, turn.logprobs),
            prompt_messages=messages,
            response_message=reply,
        )

    def prime() -> None:
        tree, count = state
        manager._trees["s"], manager._turn_count["s"] = tree, count  # noqa: SLF001
        for node in nodes:
            node.response_trained = False

    state: list[Any] = []
    nodes: list[Any] = []

    def freeze() -> None:
        tree = manager._trees.get("s")  # noqa: SLF001 - put back to time finish again
        state[:] = [tree, manager._turn_count.get("s")]  # noqa: SLF001
        seen = {id(n): n for leaf in tree.leaves() for n in leaf.path_from_root()} if tree else {}
        nodes[:] = list(seen.values())

    def finish() -> Any:
        return manager.get_trajectory("s", base_sample=SlimeSample())

    return {"step": step, "freeze": freeze, "prime": prime, "finish": finish}


def _tokentrail_stepper(tokenizer: LoadedTokenizer, turns: list, replies: list) -> dict:
    """tokentrail's side one turn at a time (as `sessions.replay_in_process`: the request
    reader, prepare and record; the deferred splice check after, untimed), and its finish."""
    from tokentrail.adapter import Adapter
    from tokentrail.adapter.config import AdapterConfig
    from tokentrail.sim.model import SimulatedEngine
    from tokentrail.trajectory.timing import TurnTiming

    config = AdapterConfig(request_memo=256, workers=0)
    adapter = Adapter(engine=SimulatedEngine(tokenizer), tokenizer=tokenizer, config=config)
    pipeline, headers = adapter.pipeline, {"x-api-key": "s"}
    manager = adapter.manager
    held: list[Any] = []

    def step(k: int) -> None:
        turn = turns[k]
        request = adapter.requests.request(PROTOCOL, turn.body, "s", headers)
        prepared = pipeline.prepare("s", request.conversation, timing=TurnTiming())
        sampled = Sampled(turn.output_ids, turn.logprobs, turn.finish_reason)
        pipeline.record(prepared, sampled, replies[k])

    def after(k: int) -> None:
        pipeline.check_splice("s")

    def freeze() -> None:
        held[:] = [manager._sessions["s"]]  # noqa: SLF001 - put back to time finish again

    def prime() -> None:
        manager._sessions["s"] = held[0]  # noqa: SLF001

    return {
        "step": step,
        "after": after,
        "freeze": freeze,
        "prime": prime,
        "finish": lambda: manager.finish("s"),
    }


def alternating(
    tokenizer: LoadedTokenizer, turns: list, replies: list, finishes: int
) -> dict[str, list[float]]:
    """Both sides in one process, alternating: each turn of the session timed on one side
    then the other (which goes first alternates), then `finishes` finishes of each, one after
    the other (process CPU). What one side's time meets on a loaded machine, the other's
    meets too. Prep in wall time (as the separate runs), ms. The sessions share one heap
    while they are played: each side's prep pays the collector's scans of both."""
    gc.collect()
    gc.freeze()
    sides = {
        "slime": _slime_stepper(tokenizer, turns, replies),
        "tokentrail": _tokentrail_stepper(tokenizer, turns, replies),
    }
    prep: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for k in range(len(turns)):
        for name in order if k % 2 == 0 else order[::-1]:
            side = sides[name]
            start = time.perf_counter()
            side["step"](k)
            prep[name].append((time.perf_counter() - start) * 1e3)
            if "after" in side:
                side["after"](k)
    spent: dict[str, list[float]] = {name: [] for name in sides}
    for side in sides.values():
        side["freeze"]()
    # Both sessions are frozen out of the collector's scans, as each side's heap is in its
    # own process: else a finish that allocates pays for scanning the other side's session.
    gc.collect()
    gc.freeze()
    for i in range(finishes):
        for name in order if i % 2 == 0 else order[::-1]:
            side = sides[name]
            side["prime"]()
            start = time.process_time()
            side["finish"]()
            spent[name].append((time.process_time() - start) * 1e3)
    late = len(turns) // 2
    return {
        **{f"prep {name}": prep[name][late:] for name in sides},
        **{f"finish {name}": spent[name] for name in sides},
    }


def _traced(run: Any, tokenizer: LoadedTokenizer, turns: list, replies: list) -> tuple[int, Any]:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    result = run(tokenizer, turns, replies)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return held, result


def held_bytes(run: Any, name: str, tokenizer: LoadedTokenizer, turns: list, replies: list) -> int:
    held, result = _traced(run, tokenizer, turns, replies)
    # What either side allocates with no session at all (a loaded template, caches).
    held -= _traced(run, tokenizer, [], [])[0]
    if name == "tokentrail":
        held += result["manager"]._sessions["s"].store.heap_bytes()  # noqa: SLF001 - measuring
    return held


def finish_profile(prime: Any, finish: Any, times: int) -> list[tuple[str, float]]:
    """The functions taking the most of finish by their own time under cProfile (process CPU,
    over `times` finishes), as (function, share). The profiler's cost per call inflates the
    Python functions' shares against the Rust core's."""
    profile = cProfile.Profile(time.process_time)
    for _ in range(times):
        prime()
        profile.enable()
        finish()
        profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(row[2] for row in stats.values()) or 1.0
    rows = []
    for (path, line, func), (_, _, own, _, _) in stats.items():
        where = (
            func if path == "~" else f"{Path(path).parent.name}/{Path(path).name}:{line}({func})"
        )
        rows.append((where, own / total))
    return sorted(rows, key=lambda r: -r[1])[:10]


class _TimedStore:
    """A session's store whose `linearize` (the Rust core's) is timed."""

    def __init__(self, store: Any, spent: dict[str, float]) -> None:
        self._store, self._spent = store, spent

    def linearize(self, *args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return self._store.linearize(*args, **kwargs)
        finally:
            self._spent["store.linearize (Rust)"] += time.process_time() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def finish_phases(manager: Any, prime: Any, finish: Any, times: int) -> list[tuple[str, float]]:
    """Process CPU per finish of each stage of tokentrail's linearization, timed without a
    profiler (each stage wrapped where `linearize_session` calls it), and the rest."""
    from tokentrail.trajectory import linearize

    phases = ["build_ledger", "_sample", "tree_stats", "replay_rows", "subagent_prompts", "_chains"]
    spent = dict.fromkeys(["store.linearize (Rust)", *phases], 0.0)
    originals = {name: getattr(linearize, name) for name in phases}

    def timed(name: str) -> Any:
        fn = originals[name]

        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.process_time() - start

        return run

    total = 0.0
    try:
        for name in phases:
            setattr(linearize, name, timed(name))
        for _ in range(times):
            prime()
            session = manager._sessions["s"]  # noqa: SLF001 - timing its store's linearize
            store = session.store
            session.store = _TimedStore(store, spent)
            start = time.process_time()
            try:
                finish()
            finally:
                total += time.process_time() - start
                session.store = store
    finally:
        for name, fn in originals.items():
            setattr(linearize, name, fn)
    rows = [(name, t / times * 1e3) for name, t in spent.items()]
    rows.append(
        ("the rest (walk, tags, drifts, placements)", (total - sum(spent.values())) / times * 1e3)
    )
    return rows


def measure(
    name: str,
    run: Any,
    tokenizer: LoadedTokenizer,
    turns: list,
    replies: list,
    repeats: int,
    finishes: int,
) -> dict:
    """Times from `repeats` replays of the session, each figure the median over them (this
    machine's noise moves one replay's p50 by tens of percent). Finish is timed `finishes`
    times after each replay, the session put back after each, in process CPU time (what a
    loaded machine's preemptions do not inflate). What the process holds before the first
    replay (the tokenizer, the recorded session, imported modules) is frozen out of the
    garbage collector's scans, as `tokentrail serve` freezes its startup heap."""
    gc.collect()
    gc.freeze()
    runs = []
    for _ in range(repeats):
        result = run(tokenizer, turns, replies)
        spent = []
        for _ in range(finishes):
            result["prime"]()
            start = time.process_time()
            samples = result["finish"]()
            spent.append((time.process_time() - start) * 1e3)
        ms = np.array(result["times"]) * 1e3
        late = ms[len(ms) // 2 :]
        runs.append(
            (float(np.percentile(late, 50)), float(np.percentile(late, 99)), min(spent), spent)
        )
    if name == "tokentrail":
        samples = samples.samples
    p50, p99 = (float(np.median([r[k] for r in runs])) for k in range(2))
    finish = float(np.median([t for r in runs for t in r[3]]))
    return {
        "finish_min": min(r[2] for r in runs),
        "profile": finish_profile(result["prime"], result["finish"], finishes)
        if name == "tokentrail"
        else [],
        "phases": finish_phases(result["manager"], result["prime"], result["finish"], finishes)
        if name == "tokentrail"
        else [],
        "p50": p50,
        "p99": p99,
        "finish": finish,
        "p50s": [r[0] for r in runs],
        "memory": held_bytes(run, name, tokenizer, turns, replies),
        "samples": len(samples),
        # The deferred splice checks (turns that ran none take no time).
        "checks": [t * 1e3 for t in result.get("after", []) if t > 1e-5],
    }


def _in_child(fn: Any, *args: Any) -> Any:
    with multiprocessing.get_context("fork").Pool(1) as pool:
        return pool.apply(fn, args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--slime", default=os.environ.get("SLIME_PATH"), help="a slime checkout")
    parser.add_argument("--turns", type=int, default=128)
    parser.add_argument("--context", type=int, default=65_536)
    parser.add_argument("--repeats", type=int, default=3, help="replays per side (medians)")
    parser.add_argument("--finishes", type=int, default=20, help="finishes timed per replay")
    parser.add_argument(
        "--alternating",
        type=int,
        default=2,
        help="runs of both sides in one process, alternating turn by turn (0: none)",
    )
    args = parser.parse_args()
    if not args.slime:
        print(
            "against_slime needs a slime checkout, which this repository does not vendor:\n"
            "  git clone https://github.com/THUDM/slime /tmp/slime\n"
            "  pip install httpx   # slime.utils imports it\n"
            "  python benches/against_slime.py --slime /tmp/slime"
        )
        return 0
    sys.path.insert(0, args.slime)
    logging.getLogger("tokentrail").setLevel(logging.ERROR)
    tokenizer = load_tokenizer()
    turns = record_session(tokenizer, args.turns, args.context)
    replies = parsed_replies(tokenizer, turns)
    # Each side in a process of its own: what one leaves on the heap does not slow the other.
    sides = [
        _in_child(measure, name, run, tokenizer, turns, replies, args.repeats, args.finishes)
        for name, run in (("slime", run_slime), ("tokentrail", run_tokentrail))
    ]
    slime, tt = sides
    both = [
        _in_child(alternating, tokenizer, turns, replies, args.finishes)
        for _ in range(args.alternating)
    ]
    _, tools = claude_code_tools()
    last = len(json.loads(turns[-1].body)["messages"])
    out = Report("against_slime")
    out.line(
        f"{len(turns)} turns, last request {len(turns[-1].body) / 1e3:.0f} KB / {last} messages, "
        f"tools: {tools}; prep: wall time over the second half of the session, medians of "
        f"{args.repeats} replays; finish: process CPU, median of {args.repeats} x "
        f"{args.finishes} finishes (slime's `get_trajectory`, tokentrail's `finish`)"
    )
    out.line(f"{'':<14}{'slime':>12}{'tokentrail':>12}{'ratio':>9}")
    for key, label, unit in (
        ("p50", "prep p50", "ms"),
        ("p99", "prep p99", "ms"),
        ("finish", "finish", "ms"),
        ("finish_min", "finish min", "ms"),
        ("memory", "memory", "MB"),
    ):
        scale = 1e-6 if unit == "MB" else 1.0
        a, b = slime[key] * scale, tt[key] * scale
        out.line(f"{label + ' ' + unit:<14}{a:>12.2f}{b:>12.2f}{a / b:>8.1f}x")
    out.line(f"{'samples':<14}{slime['samples']:>12}{tt['samples']:>12}")
    for side, r in (("slime", slime), ("tokentrail", tt)):
        out.line(f"{side} prep p50 per replay: " + ", ".join(f"{v:.2f}" for v in r["p50s"]))
    checks = tt["checks"]
    if checks:
        out.line(
            f"tokentrail's splice checks after the reply: {len(checks)} in {len(turns)} turns, "
            f"p50 {np.percentile(checks, 50):.2f} ms, max {max(checks):.2f} ms"
        )
    for run, times in enumerate(both, 1):
        out.line()
        out.line(
            f"same process, alternating (run {run} of {len(both)}, load average "
            f"{os.getloadavg()[0]:.1f} after it): prep p50 over the second half's turns "
            f"(wall), finish median of {args.finishes} each (process CPU)"
        )
        out.line(f"{'':<14}{'slime':>12}{'tokentrail':>12}{'ratio':>9}")
        for label, key in (("prep p50 ms", "prep"), ("finish ms", "finish")):
            a = float(np.median(times[f"{key} slime"]))
            b = float(np.median(times[f"{key} tokentrail"]))
            out.line(f"{label:<14}{a:>12.2f}{b:>12.2f}{a / b:>8.1f}x")
    out.line()
    out.line("where tokentrail's finish goes: process CPU per finish, by stage (no profiler)")
    for where, ms in tt["phases"]:
        out.line(f"  {ms:>7.3f} ms {ms / tt['finish']:>6.1%}  {where}")
    out.line(
        "and by function, own time under cProfile (shares of the profiled time; the profiler "
        "inflates Python calls against the Rust core)"
    )
    for where, share in tt["profile"]:
        out.line(f"  {share:>6.1%}  {where}")
    out.line(f"machine: {machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
