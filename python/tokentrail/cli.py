"""The `tokentrail` command: `serve` the adapter, run the `demo`.

`tokentrail demo` is the main job on built-in defaults: the scripted engine, the Qwen3
vocabulary and a harness that re-renders echoes as Claude Code does; no GPU, no network.
`tokentrail demo --family NAME` runs it for another model family (its vocabulary, template and
output format).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from tokentrail.kinds import Backend, DriftPolicy, History, Restore, RewritePolicy


def _names(enum: Any) -> list[str]:
    return [member.value for member in enum]


DEMO_TASK = "Fix the spacing in calc.py, add util.py with mul(), and write NOTES.md."
DEMO_OUT = "tokentrail-demo-samples.jsonl"


def _serve(args: argparse.Namespace) -> int:
    import tokentrail.sim  # noqa: F401 - registers the simulated model as an engine
    from tokentrail.adapter.limits import Limits
    from tokentrail.adapter.server import Adapter, AdapterConfig, serve_forever
    from tokentrail.engines import create_engine
    from tokentrail.errors import TokentrailError
    from tokentrail.storage.journal import Journal
    from tokentrail.text.families import resolve_family
    from tokentrail.text.tokenizer import load_tokenizer
    from tokentrail.trajectory.manager import TrajectoryManager

    limits = Limits(
        max_body_bytes=args.max_body_bytes,
        max_json_depth=args.max_json_depth,
        max_messages=args.max_messages,
        max_tools=args.max_tools,
        max_tool_schema_bytes=args.max_tool_schema_bytes,
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
        max_header_bytes=args.max_header_bytes,
        body_timeout_s=args.body_timeout,
        idle_connection_s=args.idle_connection_timeout,
        max_connections=args.max_connections,
        max_concurrent_turns=args.max_concurrent_turns,
        engine_concurrency=args.engine_concurrency,
    )
    tool_parser = None if args.tool_parser == "none" else args.tool_parser
    reasoning_parser = None if args.reasoning_parser == "none" else args.reasoning_parser
    config = AdapterConfig(
        model_name=args.model_name,
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        max_turns_per_session=args.max_turns_per_session,
        max_context_tokens=args.max_context_tokens,
        admin_token=args.admin_token or os.environ.get("TOKENTRAIL_ADMIN_TOKEN") or None,
        session_from_body=args.session_from_body,
        limits=limits,
        workers=args.workers,
        max_sessions=args.max_sessions,
        session_idle_ttl_s=args.session_idle_ttl,
        finish_retention_s=args.finish_retention,
        restore=Restore(args.restore),
        history=History(args.history),
        splice_verify_every=args.splice_verify_every,
        exclude_patterns=tuple(args.exclude_system),
        exclude_known_side_requests=args.exclude_side_requests,
        routed_experts=args.routed_experts,
        indexer_topk=args.indexer_topk,
    )
    try:
        tokenizer = load_tokenizer(args.tokenizer)
        template = Path(args.chat_template).read_text() if args.chat_template else None
        routing, indexer = _replay_shapes(args)
        fam = resolve_family(tokenizer, template)
        print(
            f"model family {fam.name}: tool parser "
            f"{fam.tool_parser if tool_parser == 'auto' else tool_parser}, reasoning parser "
            f"{fam.reasoning_parser if reasoning_parser == 'auto' else reasoning_parser}"
        )
        manager = TrajectoryManager(
            fork_threshold_tokens=args.fork_threshold,
            drift_policy=args.drift_policy,
            rewrite_policy=args.rewrite_policy,
            backend=args.backend,
            routing=routing,
            indexer=indexer,
        )
        journal = Journal(args.journal, sync=args.journal_sync) if args.journal else None
        adapter = Adapter(
            engine=create_engine(args.engine, tokenizer, timeout=args.engine_timeout),
            tokenizer=tokenizer,
            chat_template=template,
            manager=manager,
            config=config,
            journal=journal,
        )
    except (TokentrailError, OSError) as exc:
        print(f"tokentrail serve: {exc}", file=sys.stderr)
        return 2
    if config.admin_token is None:
        logging.getLogger(__name__).warning(
            "no --admin-token: the admin routes (finish, drop) are off over HTTP"
        )
    serve_forever(
        adapter,
        args.host,
        args.port,
        lambda url: print(f"tokentrail serving on {url}", flush=True),
    )
    return 0


def _replay_shapes(args: argparse.Namespace) -> tuple[Any, Any]:
    """The routing and indexer shapes `--routed-experts` / `--indexer-topk` need: the flags'
    own, else the model's config.json (`--model-config`, else the tokenizer's directory)."""
    from tokentrail.core.replay import (
        IndexerShape,
        RoutingShape,
        model_shapes,
        read_model_config,
    )

    routing = RoutingShape.parse(args.routing_shape) if args.routing_shape else None
    indexer = IndexerShape.parse(args.indexer_shape) if args.indexer_shape else None
    wanted = (args.routed_experts and routing is None) or (args.indexer_topk and indexer is None)
    if wanted:
        source = args.model_config or (args.tokenizer if Path(args.tokenizer).is_dir() else None)
        if source is None:
            raise SystemExit(
                "tokentrail serve: --routed-experts and --indexer-topk need the model's shape: "
                "--model-config DIR, a model directory as --tokenizer, or --routing-shape "
                "LAYERS,TOP_K,NUM_EXPERTS / --indexer-shape LAYERS,TOP_K"
            )
        from_config = model_shapes(read_model_config(source))
        routing, indexer = routing or from_config[0], indexer or from_config[1]
        for flag, shape, name in (
            (args.routed_experts, routing, "routed experts"),
            (args.indexer_topk, indexer, "indexer top-k"),
        ):
            if flag and shape is None:
                raise SystemExit(f"tokentrail serve: the model config at {source} has no {name}")
    return (routing if args.routed_experts else None), (indexer if args.indexer_topk else None)


DEMO_CONFIGS = (
    ("restore on", "on", "fork"),
    ("restore off", "off", "fork"),
    ("restore off, upstream merge", "off", "merge"),
)


async def _demo_run(restore: str, rewrite_policy: str, tokenizer: Any) -> tuple[dict, Any]:
    import secrets

    import aiohttp

    from tokentrail.adapter.server import Adapter, AdapterConfig, start_server
    from tokentrail.engines.scripted import ScriptedEngine
    from tokentrail.sim.harness import HarnessSim, Workspace
    from tokentrail.trajectory.manager import TrajectoryManager

    admin = secrets.token_hex(16)
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer),
        tokenizer=tokenizer,
        manager=TrajectoryManager(rewrite_policy=rewrite_policy),
        config=AdapterConfig(restore=Restore(restore), admin_token=admin),
    )
    runner, url = await start_server(adapter)
    try:
        async with aiohttp.ClientSession() as http:
            sim = await HarnessSim(url, "demo", workspace=Workspace()).run(DEMO_TASK, http)
            async with http.post(
                f"{url}/tokentrail/sessions/demo/finish",
                json={"reward": 1.0},
                headers={"Authorization": f"Bearer {admin}"},
            ) as resp:
                finished = await resp.json()
    finally:
        await runner.cleanup()
    return finished, sim


async def _demo_codex(tokenizer: Any) -> tuple[Any, Any]:
    """A Codex-shaped session (exec_command, the free-form apply_patch) over the Responses API."""
    import aiohttp

    from tokentrail.adapter.server import Adapter, start_server
    from tokentrail.engines.scripted import ScriptedEngine
    from tokentrail.sim.codex import CODEX_FILES, CODEX_SCRIPT, CODEX_TOOLS, CodexWorkspace
    from tokentrail.sim.harness import Behaviour, HarnessSim

    # One user turn of the script: read, two parallel commands, a failed and a good patch, the
    # test run, the answer. Codex sends every item back as it got it, so nothing is rewritten.
    script = CODEX_SCRIPT[:6]
    adapter = Adapter(engine=ScriptedEngine(tokenizer, script), tokenizer=tokenizer)
    runner, url = await start_server(adapter)
    try:
        async with aiohttp.ClientSession() as http:
            sim = await HarnessSim(
                url,
                "demo-codex",
                protocol="responses",
                tools=CODEX_TOOLS,
                workspace=CodexWorkspace(dict(CODEX_FILES)),
                behaviour=Behaviour(
                    rerender_echoes=False, move_cache_control=False, system_notes=False
                ),
            ).run("Space the sum in calc.py.", http)
        trajectory = await adapter.finish_trajectory("demo-codex", reward=1.0)
    finally:
        await runner.cleanup()
    return trajectory, sim


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


def _demo_tokenizer(args: argparse.Namespace) -> Any:
    from tokentrail.text.families import family
    from tokentrail.text.tokenizer import load_tokenizer

    if args.family is None:
        return load_tokenizer(args.tokenizer)
    fam = family(args.family)
    # The family's own vocabulary where a package ships it, else Qwen3's ranks with its tokens.
    return load_tokenizer(f"builtin:{fam.name}" if fam.vocabulary else f"stand-in:{fam.name}")


def _demo(args: argparse.Namespace) -> int:
    tokenizer = _demo_tokenizer(args)
    runs = []
    for name, restore, policy in DEMO_CONFIGS:
        finished, sim = asyncio.run(_demo_run(restore, policy, tokenizer))
        runs.append((name, finished))
        if name == DEMO_CONFIGS[0][0]:
            first, first_sim = finished, sim
    codex, codex_sim = asyncio.run(_demo_codex(tokenizer))
    out = Path(args.out)
    with out.open("w") as f:
        for sample in first["samples"]:
            f.write(json.dumps(sample) + "\n")
    calls = ", ".join(f"{k}={v}" for k, v in sorted(first_sim.tool_calls.items()))
    print(
        f"tokentrail demo: scripted engine, family {tokenizer.family or 'qwen3'} "
        f"({tokenizer.name}), Claude Code 2.1.197-style harness"
    )
    print(
        f"session: {first_sim.requests} requests, tool calls {calls}; "
        f"{first_sim.rewritten_echoes} tool calls re-rendered by the harness"
    )
    print()
    print(_demo_table(runs))
    print()
    ledger = codex.ledger
    codex_calls = ", ".join(f"{k}={v}" for k, v in sorted(codex_sim.tool_calls.items()))
    print("Codex CLI 0.169-style session over the OpenAI Responses API (custom apply_patch tool):")
    print(
        f"session: {codex_sim.requests} requests, tool calls {codex_calls}; "
        f"{ledger.trained_tokens}/{ledger.generated_tokens} generated tokens trained, "
        f"{len(codex.samples)} sample, echoes restored: {ledger.restored_echoes}"
    )
    print()
    print(
        f"wrote {len(first['samples'])} samples ({DEMO_CONFIGS[0][0]}) to {out}: one JSON object "
        "per line with tokens, loss_mask, rollout_log_probs, response_length, reward, metadata"
    )
    return 0


def _check_template(args: argparse.Namespace) -> int:
    from tokentrail.text.families import resolve_family
    from tokentrail.text.tokenizer import load_tokenizer
    from tokentrail.trajectory.splice import check_template

    target = Path(args.target)
    if target.is_dir():
        tokenizer, template = load_tokenizer(str(target)), None
    else:
        tokenizer, template = load_tokenizer(args.tokenizer), target.read_text()
    fam = resolve_family(tokenizer, template)
    reports = check_template(tokenizer, template, fam)
    ends = sorted({fam.end_after_calls, fam.end_after_text})
    print(
        f"template: {target}  (family {fam.name}; assistant turns end with "
        f"{', '.join(repr(e) for e in ends)})"
    )
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
    from tokentrail.storage.journal import read_journal
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
        routing=recorded.routing,
        indexer=recorded.indexer,
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
        from tokentrail.storage.journal import read_journal
        from tokentrail.storage.replay import as_recorded

        ledgers = [t.ledger for t in as_recorded(read_journal(path)).values()]
    table, fraction = audit_table(ledgers)
    print(table)
    failed = fraction > args.max_masked
    if failed:
        print(f"FAIL: masked fraction {fraction:.4f} is above {args.max_masked}")
    else:
        print(f"ok: masked fraction {fraction:.4f} is within {args.max_masked}")
    if args.require_routing:
        from tokentrail.storage.replay import replay_table

        replay_lines, complete = replay_table(ledgers)
        print(replay_lines)
        if not complete:
            print("FAIL: replay rows are incomplete (--require-routing)")
            failed = True
    return 1 if failed else 0


def _limit_flags(serve: argparse.ArgumentParser) -> None:
    """The admission limits and the engine's, each with the default `Limits` holds."""
    from tokentrail.adapter.limits import Limits
    from tokentrail.adapter.offload import DEFAULT_WORKERS
    from tokentrail.adapter.server import AdapterConfig

    d, c = Limits(), AdapterConfig()
    group = serve.add_argument_group("limits (README: Operating it)")
    for flag, default, kind, text in (
        ("--max-body-bytes", d.max_body_bytes, int, "bytes of one request body (413 past it)"),
        ("--max-json-depth", d.max_json_depth, int, "nesting of JSON values (400 past it)"),
        ("--max-messages", d.max_messages, int, "messages per request"),
        ("--max-tools", d.max_tools, int, "tools per request"),
        ("--max-tool-schema-bytes", d.max_tool_schema_bytes, int, "bytes of all tool schemas"),
        ("--max-prompt-tokens", d.max_prompt_tokens, int, "0: the model config's context"),
        ("--max-output-tokens", d.max_output_tokens, int, "max_tokens above this is clamped"),
        ("--max-header-bytes", d.max_header_bytes, int, "one request or header line"),
        ("--body-timeout", d.body_timeout_s, float, "seconds for a body to arrive (408)"),
        ("--idle-connection-timeout", d.idle_connection_s, float, "seconds without a request"),
        ("--max-connections", d.max_connections, int, "0: what the fd limit allows"),
        ("--max-concurrent-turns", d.max_concurrent_turns, int, "503 + Retry-After past it"),
        ("--engine-concurrency", d.engine_concurrency, int, "engine calls at once; 0: any"),
        ("--engine-timeout", 600.0, float, "seconds an engine call may take (502 after)"),
        ("--workers", DEFAULT_WORKERS, int, "threads for CPU-heavy steps; 0: on the loop"),
        ("--max-sessions", c.max_sessions, int, "open sessions (503 past it); 0: no cap"),
        ("--session-idle-ttl", c.session_idle_ttl_s, float, "evict sessions idle this long"),
        ("--finish-retention", c.finish_retention_s, float, "seconds a finish is kept"),
    ):
        group.add_argument(flag, type=kind, default=default, help=f"{text} (default {default})")


def build_parser() -> argparse.ArgumentParser:
    from tokentrail.text.families import families
    from tokentrail.text.formats import reasoning_format_names, tool_format_names

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
    serve.add_argument(
        "--tokenizer",
        default="builtin:qwen3",
        help="builtin:VOCABULARY or builtin:FAMILY, stand-in:FAMILY, or a model dir",
    )
    serve.add_argument("--chat-template", default=None, help="a Jinja file overriding the model's")
    serve.add_argument(
        "--tool-parser",
        default="auto",
        choices=["auto", "none", *tool_format_names()],
        help="auto: the model family's (from the tokenizer or the chat template)",
    )
    serve.add_argument(
        "--reasoning-parser", default="auto", choices=["auto", "none", *reasoning_format_names()]
    )
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
    serve.add_argument(
        "--max-context-tokens",
        type=int,
        default=0,
        help="a prompt over this is answered `length` without generating (a rollout budget)",
    )
    serve.add_argument(
        "--admin-token",
        default=None,
        help="token the admin routes (finish, drop) need; without one (nor "
        "TOKENTRAIL_ADMIN_TOKEN) they are off over HTTP",
    )
    serve.add_argument(
        "--session-from-body",
        action="store_true",
        help="let OpenAI bodies (metadata.session_id, user) name the session instead of the "
        "API key: only when every client is trusted",
    )
    _limit_flags(serve)
    serve.add_argument("--journal", default=None, help="SQLite journal: recover, then append")
    serve.add_argument("--journal-sync", default="normal", choices=["normal", "full"])
    serve.add_argument("--model-name", default="tokentrail")
    serve.add_argument("--backend", default=None, choices=_names(Backend))
    serve.add_argument(
        "--routed-experts",
        action="store_true",
        help="ask the engine for every turn's MoE routed experts and carry them in the samples",
    )
    serve.add_argument(
        "--indexer-topk",
        action="store_true",
        help="ask the engine for every turn's sparse-attention indexer top-k (SGLang)",
    )
    serve.add_argument(
        "--model-config",
        default=None,
        help="the model's config.json (or its dir), for the routing and indexer shapes",
    )
    serve.add_argument("--routing-shape", default=None, help="LAYERS,TOP_K,NUM_EXPERTS")
    serve.add_argument("--indexer-shape", default=None, help="LAYERS,TOP_K")
    serve.add_argument(
        "--restore",
        default="on",
        choices=_names(Restore),
        help="restore harness-re-rendered echoes before rendering (on), in the tree only, or off",
    )
    serve.add_argument(
        "--exclude-system",
        action="append",
        default=[],
        metavar="REGEX",
        help="exclude side conversations whose first message (the system prompt, or the first "
        "user message) matches REGEX from training; repeatable",
    )
    serve.add_argument(
        "--exclude-side-requests",
        action="store_true",
        help="exclude the known side requests of Qwen Code (memory extraction) and hermes-agent "
        "(context summarizer) from training",
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
    aud.add_argument(
        "--require-routing",
        action="store_true",
        help="exit 1 unless every sample token carries its replay rows (routed experts, "
        "indexer top-k where kept)",
    )
    aud.set_defaults(func=_audit)

    demo = sub.add_parser("demo", help="run a scripted coding session end to end")
    demo.add_argument("--out", default=DEMO_OUT)
    demo.add_argument("--tokenizer", default="builtin:qwen3")
    demo.add_argument(
        "--family",
        default=None,
        choices=[f.name for f in families()],
        help="run the demo for this model family (its vocabulary, or a stand-in, and format)",
    )
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
