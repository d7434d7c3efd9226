"""The `tokentrail` command: `serve` the adapter, `replay`/`audit`/`journal` its records, run
the `demo`.

`tokentrail demo` is the main job on built-in defaults: the scripted engine, the Qwen3
vocabulary and a harness that re-renders echoes as Claude Code does; no GPU, no network.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from tokentrail.kinds import Backend, DriftPolicy, History, Restore, Retry, RewritePolicy


def _names(enum: Any) -> list[str]:
    return [member.value for member in enum]


DEMO_TASK = "Fix the spacing in calc.py, add util.py with mul(), and write NOTES.md."
DEMO_OUT = "tokentrail-demo-samples.jsonl"


def _serve(args: argparse.Namespace) -> int:
    import tokentrail.sim  # noqa: F401 - registers the simulated model as an engine
    from tokentrail.adapter.server import Adapter, AdapterConfig
    from tokentrail.engines import create_engine
    from tokentrail.storage.journal import Journal
    from tokentrail.text.tokenizer import load_tokenizer
    from tokentrail.trajectory.manager import TrajectoryManager

    tokenizer = load_tokenizer(args.tokenizer)
    template = Path(args.chat_template).read_text() if args.chat_template else None
    config = AdapterConfig(
        model_name=args.model_name,
        tool_parser=None if args.tool_parser == "none" else args.tool_parser,
        reasoning_parser=None if args.reasoning_parser == "none" else args.reasoning_parser,
        max_turns_per_session=args.max_turns_per_session,
        max_context_tokens=args.max_context_tokens,
        admin_token=args.admin_token,
        restore=Restore(args.restore),
        history=History(args.history),
        splice_verify_every=args.splice_verify_every,
        retry=Retry(args.retries),
    )
    manager = TrajectoryManager(
        fork_threshold_tokens=args.fork_threshold,
        drift_policy=args.drift_policy,
        rewrite_policy=args.rewrite_policy,
        backend=args.backend,
    )
    journal = Journal(args.journal, sync=args.journal_sync) if args.journal else None
    adapter = Adapter(
        engine=create_engine(args.engine, tokenizer),
        tokenizer=tokenizer,
        chat_template=template,
        manager=manager,
        config=config,
        journal=journal,
    )
    web.run_app(
        adapter.app,
        host=args.host,
        port=args.port,
        handler_cancellation=True,
        print=lambda msg: print(f"tokentrail serving on http://{args.host}:{args.port}"),
    )
    return 0


DEMO_CONFIGS = (
    ("restore on", "on", "fork"),
    ("restore off", "off", "fork"),
    ("restore off, upstream merge", "off", "merge"),
)


async def _demo_run(restore: str, rewrite_policy: str, tokenizer: Any) -> tuple[dict, Any]:
    import aiohttp

    from tokentrail.adapter.server import Adapter, AdapterConfig, start_server
    from tokentrail.engines.scripted import ScriptedEngine
    from tokentrail.sim.harness import HarnessSim, Workspace
    from tokentrail.trajectory.manager import TrajectoryManager

    adapter = Adapter(
        engine=ScriptedEngine(tokenizer),
        tokenizer=tokenizer,
        manager=TrajectoryManager(rewrite_policy=rewrite_policy),
        config=AdapterConfig(restore=Restore(restore)),
    )
    runner, url = await start_server(adapter)
    try:
        async with aiohttp.ClientSession() as http:
            sim = await HarnessSim(url, "demo", workspace=Workspace()).run(DEMO_TASK, http)
            async with http.post(
                f"{url}/tokentrail/sessions/demo/finish", json={"reward": 1.0}
            ) as resp:
                finished = await resp.json()
    finally:
        await runner.cleanup()
    return finished, sim


def _demo_table(runs: list[tuple[str, dict[str, Any]]]) -> str:
    """Per tool: trained turns and tokens under each configuration."""
    width = max(len(name) for name, _ in runs) + 2
    tools = sorted({tool for _, r in runs for tool in r["ledger"]["by_tool"]})
    lines = [f"{'':<{width}}" + "".join(f"{tool:>14}" for tool in tools) + f"{'samples':>9}"]
    for name, run in runs:
        by_tool = run["ledger"]["by_tool"]
        cells = []
        for tool in tools:
            row = by_tool.get(tool, {})
            cells.append(f"{row.get('turns_trained', 0)}/{row.get('turns', 0)} turns")
        lines.append(
            f"{name:<{width}}" + "".join(f"{c:>14}" for c in cells) + f"{len(run['samples']):>9}"
        )
    lines.append("")
    for name, run in runs:
        ledger = run["ledger"]
        gen, trained = ledger["generated_tokens"], ledger["trained_tokens"]
        share = 100.0 * trained / gen if gen else 0.0
        masked = ", ".join(f"{k}={v}" for k, v in ledger["masked_tokens"].items()) or "none"
        lines.append(
            f"{name:<{width}}{trained}/{gen} generated tokens trained ({share:.1f}%); "
            f"masked: {masked}; echoes restored: {ledger['restored_echoes']}"
        )
    return "\n".join(lines)


def _demo(args: argparse.Namespace) -> int:
    from tokentrail.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    runs = []
    for name, restore, policy in DEMO_CONFIGS:
        finished, sim = asyncio.run(_demo_run(restore, policy, tokenizer))
        runs.append((name, finished))
        if name == DEMO_CONFIGS[0][0]:
            first, first_sim = finished, sim
    out = Path(args.out)
    with out.open("w") as f:
        for sample in first["samples"]:
            f.write(json.dumps(sample) + "\n")
    calls = ", ".join(f"{k}={v}" for k, v in sorted(first_sim.tool_calls.items()))
    print("tokentrail demo: scripted engine, Qwen3 vocabulary, Claude Code 2.1.197-style harness")
    print(
        f"session: {first_sim.requests} requests, tool calls {calls}; "
        f"{first_sim.rewritten_echoes} tool calls re-rendered by the harness"
    )
    print()
    print(_demo_table(runs))
    print()
    print(
        f"wrote {len(first['samples'])} samples ({DEMO_CONFIGS[0][0]}) to {out}: one JSON object "
        "per line with tokens, loss_mask, rollout_log_probs, response_length, reward, metadata"
    )
    return 0


def _check_template(args: argparse.Namespace) -> int:
    from tokentrail.text.tokenizer import load_tokenizer
    from tokentrail.trajectory.splice import check_template

    target = Path(args.target)
    if target.is_dir():
        tokenizer, template = load_tokenizer(str(target)), None
    else:
        tokenizer, template = load_tokenizer(args.tokenizer), target.read_text()
    reports = check_template(tokenizer, template)
    print(f"template: {target}  (assistant turns end with {tokenizer.eos_token!r})")
    print(f"{'boundary':<28}{'prefix-preserving':>18}{'splice':>8}  glue / reason")
    for r in reports:
        detail = repr(r.glue) if r.splice else f"fallback: {r.fallback}"
        print(
            f"{r.name:<28}{'yes' if r.prefix_preserving else 'no':>18}"
            f"{'yes' if r.splice else 'no':>8}  {detail}"
        )
    ok = all(r.splice for r in reports)
    print("splicing is possible" if ok else "splicing is NOT possible: turns fall back to render")
    return 0 if ok else 1


def _replay(args: argparse.Namespace) -> int:
    from tokentrail.storage.journal_read import read_journal
    from tokentrail.storage.replay import Settings, as_recorded, progress_bar, replay, side_by_side
    from tokentrail.text.tokenizer import load_tokenizer

    contents = read_journal(args.journal)
    recorded = Settings.recorded(contents.meta)
    settings = Settings(
        restore=Restore(args.restore or recorded.restore),
        history=History(args.history or recorded.history),
        drift_policy=DriftPolicy(args.drift_policy or recorded.drift_policy),
        rewrite_policy=RewritePolicy(args.rewrite_policy or recorded.rewrite_policy),
        fork_threshold=recorded.fork_threshold,
    )
    tokenizer = load_tokenizer(args.tokenizer or contents.meta.get("tokenizer", "builtin:qwen3"))
    before = as_recorded(contents)
    after = replay(contents, settings, tokenizer, progress=progress_bar)
    print(
        side_by_side(
            before,
            after,
            f"as recorded ({recorded.describe()})",
            f"replayed ({settings.describe()})",
        )
    )
    if args.out:
        from tokentrail.storage.export import write_samples

        samples = [s for t in after.values() for s in t.samples]
        write_samples(args.out, samples)
        print(f"wrote {len(samples)} replayed samples to {args.out}")
    return 0


def _audit(args: argparse.Namespace) -> int:
    from tokentrail.storage.replay import audit_table
    from tokentrail.trajectory.ledger import Ledger

    path = Path(args.target)
    if path.suffix in (".json", ".jsonl"):
        ledgers = []
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                ledgers.append(Ledger.from_dict(record.get("ledger", record)))
    else:
        from tokentrail.storage.journal_read import read_journal
        from tokentrail.storage.replay import as_recorded

        ledgers = [t.ledger for t in as_recorded(read_journal(path)).values()]
    table, fraction = audit_table(ledgers)
    print(table)
    if fraction > args.max_masked:
        print(f"FAIL: masked fraction {fraction:.4f} is above {args.max_masked}")
        return 1
    print(f"ok: masked fraction {fraction:.4f} is within {args.max_masked}")
    return 0


def _journal_check(args: argparse.Namespace) -> int:
    from tokentrail.storage.journal_read import check_journal

    report = check_journal(args.journal)
    print(report.table())
    return 0 if report.ok else 1


def _journal_compact(args: argparse.Namespace) -> int:
    from tokentrail.storage.journal_compact import compact

    done = compact(args.journal, export_to=args.export)
    if done.exported is not None:
        print(
            f"wrote {done.exported.samples} samples of {done.exported.sessions} finished "
            f"sessions to {args.export}"
        )
    print(
        f"compacted {args.journal}: {done.bytes_before / 1e6:.2f} MB -> "
        f"{done.bytes_after / 1e6:.2f} MB; removed {done.sessions_removed} sessions "
        f"({done.events_removed} events)"
    )
    for damage in done.damaged:
        print(f"damaged: {damage.describe()}")
    return 0 if not done.damaged else 1


def _journal_export(args: argparse.Namespace) -> int:
    from tokentrail.storage.journal_compact import export_finished

    done = export_finished(args.journal, args.out)
    print(f"wrote {done.samples} samples of {done.sessions} finished sessions to {args.out}")
    for line in done.damaged:
        print(f"damaged: {line}")
    return 0 if not done.damaged else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokentrail", description=__doc__)
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the Anthropic/OpenAI adapter")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8300)
    serve.add_argument(
        "--engine",
        default="scripted",
        help="sglang://H:P, vllm://H:P, scripted[:FILE], simulated",
    )
    serve.add_argument("--tokenizer", default="builtin:qwen3", help="builtin:qwen3 or a model dir")
    serve.add_argument("--chat-template", default=None, help="a Jinja file overriding the model's")
    serve.add_argument("--tool-parser", default="hermes", choices=["hermes", "qwen3_coder", "none"])
    serve.add_argument("--reasoning-parser", default="qwen3", choices=["qwen3", "none"])
    serve.add_argument("--fork-threshold", type=int, default=1024)
    serve.add_argument("--drift-policy", default="minimal", choices=_names(DriftPolicy))
    serve.add_argument("--rewrite-policy", default="fork", choices=_names(RewritePolicy))
    serve.add_argument("--history", default="splice", choices=_names(History))
    serve.add_argument(
        "--splice-verify-every",
        type=int,
        default=8,
        help="check a spliced tail against the full render every N splices (1: every turn)",
    )
    serve.add_argument("--max-turns-per-session", type=int, default=0)
    serve.add_argument("--max-context-tokens", type=int, default=0)
    serve.add_argument("--admin-token", default=None)
    serve.add_argument("--journal", default=None, help="SQLite journal: recover, then append")
    serve.add_argument("--journal-sync", default="normal", choices=["normal", "full"])
    serve.add_argument(
        "--retries",
        default="replay",
        choices=_names(Retry),
        help="a retried request (the prompt of a turn nothing was built on): answer it with "
        "the recorded reply (replay) or generate again (fresh); the X-Tokentrail-Retry header "
        "chooses per request",
    )
    serve.add_argument("--model-name", default="tokentrail")
    serve.add_argument("--backend", default=None, choices=_names(Backend))
    serve.add_argument(
        "--restore",
        default="on",
        choices=_names(Restore),
        help="restore harness-re-rendered echoes before rendering (on), in the tree only, or off",
    )
    serve.set_defaults(func=_serve)

    check = sub.add_parser("check-template", help="can turns be spliced with this template?")
    check.add_argument("target", help="a Hugging Face model dir, or a Jinja template file")
    check.add_argument("--tokenizer", default="builtin:qwen3", help="for a template file")
    check.set_defaults(func=_check_template)

    rep = sub.add_parser("replay", help="re-linearize a journal under other settings")
    rep.add_argument("journal")
    rep.add_argument("--restore", choices=_names(Restore), default=None)
    rep.add_argument("--history", choices=_names(History), default=None)
    rep.add_argument("--drift-policy", choices=_names(DriftPolicy), default=None)
    rep.add_argument("--rewrite-policy", choices=_names(RewritePolicy), default=None)
    rep.add_argument("--tokenizer", default=None, help="default: the one the journal names")
    rep.add_argument(
        "--out", default=None, help="write the replayed samples (.npz/.jsonl/.parquet)"
    )
    rep.set_defaults(func=_replay)

    aud = sub.add_parser("audit", help="trained vs masked, per tool and reason; gate on it")
    aud.add_argument("target", help="a journal, or a JSON/JSONL of /finish answers")
    aud.add_argument(
        "--max-masked",
        type=float,
        default=0.05,
        help="exit 1 when the masked fraction of generated tokens is above this",
    )
    aud.set_defaults(func=_audit)

    jour = sub.add_parser("journal", help="check, compact or export a journal")
    jsub = jour.add_subparsers(dest="journal_command", required=True)
    jcheck = jsub.add_parser("check", help="read every event; per session, what is intact")
    jcheck.add_argument("journal")
    jcheck.set_defaults(func=_journal_check)
    jcompact = jsub.add_parser(
        "compact", help="remove finished and dropped sessions (not while a server holds it)"
    )
    jcompact.add_argument("journal")
    jcompact.add_argument(
        "--export", default=None, help="first write the finished sessions' samples here"
    )
    jcompact.set_defaults(func=_journal_compact)
    jexport = jsub.add_parser("export", help="write the finished sessions' samples to a file")
    jexport.add_argument("journal")
    jexport.add_argument("out", help="a .npz, .jsonl or .parquet file")
    jexport.set_defaults(func=_journal_export)

    demo = sub.add_parser("demo", help="run a scripted coding session end to end")
    demo.add_argument("--out", default=DEMO_OUT)
    demo.add_argument("--tokenizer", default="builtin:qwen3")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    from tokentrail.errors import JournalError

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except JournalError as exc:
        # A journal another process holds, or one this version cannot read: say so, plainly.
        print(f"tokentrail: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
