"""`tokentrail serve`: the adapter over HTTP, with its flags."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from tokentrail.cli.names import names as _names
from tokentrail.kinds import (
    Backend,
    DriftPolicy,
    History,
    Restore,
    Retry,
    RewritePolicy,
    SyncMode,
    parse_kind,
)


def add_command(sub: Any) -> None:
    from tokentrail.text.formats import reasoning_format_names, tool_format_names

    serve = sub.add_parser("serve", help="serve the Anthropic/OpenAI adapter")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8300)
    serve.add_argument(
        "--engine",
        default="scripted",
        help="sglang://H:P, vllm://H:P, scripted[:FILE], simulated, or transformers:DIR (a Hugging "
        "Face model on CPU; DIR may be tiny:NAME; transformers:DIR+scripted:FILE teacher-forces "
        "the script; torch threads from TOKENTRAIL_TORCH_THREADS)",
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
        help=(
            "check a spliced tail against the full render every N splices, after the reply, the "
            "period doubling while checks pass (up to 64); 1: every turn, before the reply"
        ),
    )
    serve.add_argument(
        "--request-memo",
        type=int,
        default=256,
        help="keep the latest request of this many recent sessions, so the next is parsed and "
        "translated only where it differs (0: every request in full)",
    )
    serve.add_argument(
        "--verify-resume",
        action="store_true",
        help="debugging: translate every request both resumed (--request-memo) and in full, "
        "count them in tokentrail_resume_checks_total and warn when they differ (the full "
        "translation is then used)",
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
    serve.add_argument(
        "--journal-sync", default=SyncMode.NORMAL.value, choices=[m.value for m in SyncMode]
    )
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
        help="exclude the known side requests of Qwen Code (memory extraction), hermes-agent "
        "(context summarizer) and opencode/kilo (title generator) from training",
    )
    _log_flags(serve)
    serve.set_defaults(func=_serve)


def _log_flags(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("logging")
    group.add_argument(
        "--log-level",
        # Unset here leaves `tokentrail --log-level` (before the command) as it is.
        default=argparse.SUPPRESS,
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="what the server logs (default WARNING): every 5xx it answers is a WARNING "
        "with its reason, session and engine request id; DEBUG adds each turn's details",
    )
    group.add_argument(
        "--access-log",
        nargs="?",
        const="-",
        default=None,
        metavar="FILE",
        help="one line per request (method, route, status, session, duration, prompt and "
        "output tokens) to FILE, or to stderr when no FILE is given (default: off)",
    )
    group.add_argument(
        "--access-log-json",
        action="store_true",
        help="write the access log's lines as JSON objects, one a line",
    )


def _serve(args: argparse.Namespace) -> int:
    import tokentrail.sim  # noqa: F401 - registers the simulated model as an engine
    from tokentrail.adapter.access_log import AccessLog
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
        restore=parse_kind(Restore, args.restore, "restore mode"),
        history=parse_kind(History, args.history, "history mode"),
        splice_verify_every=args.splice_verify_every,
        request_memo=args.request_memo,
        verify_resume=args.verify_resume,
        exclude_patterns=tuple(args.exclude_system),
        exclude_known_side_requests=args.exclude_side_requests,
        routed_experts=args.routed_experts,
        indexer_topk=args.indexer_topk,
        retry=parse_kind(Retry, args.retries, "retry mode"),
        access_log=(
            None if args.access_log is None else AccessLog(args.access_log, args.access_log_json)
        ),
    )
    try:
        tokenizer = load_tokenizer(args.tokenizer)
        template = Path(args.chat_template).read_text() if args.chat_template else None
        routing, indexer = replay_shapes(args)
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
            template_name=f"--chat-template {args.chat_template}" if template else None,
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


def replay_shapes(args: argparse.Namespace) -> tuple[Any, Any]:
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
