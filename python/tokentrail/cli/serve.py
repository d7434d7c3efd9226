"""`tokentrail serve`: the adapter over HTTP, with its settings.

Every setting is one field of `ServeSettings`: its flag, `--config` key and `TOKENTRAIL_*`
variable, its group in `--help`, its default and unit all come from that one line. To add one,
add a field there (`into="config"` hands it to the `AdapterConfig` field of the same name).
"""

from __future__ import annotations

import argparse
import logging
import re
import sqlite3
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokentrail.adapter.config import AdapterConfig
from tokentrail.adapter.limits import Limits
from tokentrail.adapter.offload import DEFAULT_WORKERS
from tokentrail.adapter.protocols.common import KEEPALIVE_S
from tokentrail.cli import settings
from tokentrail.cli.settings import setting
from tokentrail.errors import SettingError, TokentrailError
from tokentrail.kinds import (
    Backend,
    ConstrainedPolicy,
    DriftPolicy,
    History,
    Restore,
    Retry,
    RewritePolicy,
    SettingGroup,
    SyncMode,
)
from tokentrail.text.vision import ImageLimits

if TYPE_CHECKING:
    from tokentrail.adapter.server import Adapter

_L, _C, _I = Limits(), AdapterConfig(), ImageLimits()
# Upper ends of the settings' ranges: threads a process can usefully run, and a time no
# setting needs to exceed (115 days; a larger one is a typo or an overflow waiting).
MAX_WORKERS = 256
MAX_SECONDS = 10_000_000
SERVER, ENGINE, HISTORY = SettingGroup.SERVER, SettingGroup.ENGINE, SettingGroup.HISTORY
SESSIONS, LIMITS, JOURNAL = SettingGroup.SESSIONS, SettingGroup.LIMITS, SettingGroup.JOURNAL
REPLAY, STREAMING, LOGGING = SettingGroup.REPLAY, SettingGroup.STREAMING, SettingGroup.LOGGING


def _tool_parsers() -> list[str]:
    from tokentrail.text.formats import tool_format_names

    return ["auto", "none", *tool_format_names()]


def _reasoning_parsers() -> list[str]:
    from tokentrail.text.formats import reasoning_format_names

    return ["auto", "none", *reasoning_format_names()]


@dataclass
class ServeSettings:
    """Every `tokentrail serve` setting, in `--help`'s order within each group."""

    # -- server
    host: str = setting("127.0.0.1", SERVER, "address to listen on")
    port: int = setting(8300, SERVER, "TCP port to listen on", metavar="PORT", bounds=(0, 65535))
    admin_token: str | None = setting(
        None,
        SERVER,
        "token the admin routes (finish, drop) need; unset: they are off over HTTP",
        default_text="unset",
        secret=True,
        into="config",
    )
    workers: int = setting(
        DEFAULT_WORKERS,
        SERVER,
        "threads for CPU-heavy steps; 0: on the event loop",
        # The machine's: the settings reference is the same wherever it is written.
        default_text="one per core, up to 4",
        into="config",
        bounds=(0, MAX_WORKERS),
    )
    # -- engine and model
    engine: str = setting(
        "scripted",
        ENGINE,
        "the inference engine: sglang://HOST:PORT, vllm://HOST:PORT, scripted[:FILE], "
        "simulated, or transformers:DIR (a Hugging Face model on CPU; DIR may be tiny:NAME; "
        "transformers:DIR+scripted:FILE teacher-forces the script; torch threads from "
        "TOKENTRAIL_TORCH_THREADS)",
        metavar="SPEC",
    )
    tokenizer: str = setting(
        "builtin:qwen3",
        ENGINE,
        "builtin:VOCABULARY or builtin:FAMILY, stand-in:FAMILY, or a model directory",
        metavar="SPEC",
    )
    chat_template: str | None = setting(
        None, ENGINE, "a Jinja file overriding the model's chat template", metavar="FILE",
        default_text="the model's",
    )  # fmt: skip
    tool_parser: str = setting(
        "auto", ENGINE, "tool-call format; auto: the model family's", choices=_tool_parsers
    )
    reasoning_parser: str = setting(
        "auto", ENGINE, "reasoning format; auto: the model family's", choices=_reasoning_parsers
    )
    model_name: str = setting(_C.model_name, ENGINE, "the model name replies carry", into="config")
    backend: Backend | None = setting(
        None, ENGINE, "the hot path's implementation", default_text="$TOKENTRAIL_BACKEND, else rust"
    )
    engine_timeout: float = setting(
        600.0, ENGINE, "time an engine call may take (502 after)", unit="s",
        bounds=(0.001, MAX_SECONDS),
    )  # fmt: skip
    engine_concurrency: int = setting(
        _L.engine_concurrency, ENGINE, "engine calls at once; 0: any", into="limits"
    )
    # -- history and splicing
    history: History = setting(
        _C.history, HISTORY, "how a turn's prompt ids are built: splice a tail or render all",
        into="config",
    )  # fmt: skip
    splice_verify_every: int = setting(
        _C.splice_verify_every,
        HISTORY,
        "check a spliced tail against the full render every N splices (after the reply, the "
        "period doubling to 64 while checks pass); 1: every turn, before the reply",
        unit="splices",
        into="config",
    )
    render_budget: float = setting(
        _C.render_budget_s, HISTORY, "how long one render of a request's prompt may run (a "
        "template that loops on some input): a 400 after; 0: no bound", unit="s",
        into="config.render_budget_s", bounds=(0, MAX_SECONDS),
    )  # fmt: skip
    request_memo: int = setting(
        _C.request_memo,
        HISTORY,
        "sessions whose latest request is kept, so the next is parsed only where it differs; "
        "0: every request in full",
        unit="sessions",
        into="config",
    )
    verify_resume: bool = setting(
        _C.verify_resume,
        HISTORY,
        "debugging: translate every request both resumed (--request-memo) and in full, count "
        "them in tokentrail_resume_checks_total and warn when they differ (the full "
        "translation is then used)",
        into="config",
    )
    restore: Restore = setting(
        _C.restore,
        HISTORY,
        "restore harness-re-rendered echoes before rendering (on), in the tree only, or off",
        into="config",
    )
    restore_by_id: bool = setting(
        _C.restore_by_id,
        HISTORY,
        "restore an echo whose tool calls carry the ids tokentrail minted (and name the same "
        "tools) whatever the harness changed in their arguments; --no-restore-by-id leaves "
        "echoes to the coarse comparison (declared defaults, trailing whitespace) alone",
        into="config",
    )
    fork_threshold: int = setting(
        1024, HISTORY, "a drift longer than this starts a new sample", unit="tokens",
        into="manager.fork_threshold_tokens",
    )  # fmt: skip
    drift_policy: DriftPolicy = setting(
        DriftPolicy.MINIMAL, HISTORY, "how a small drift is healed", into="manager"
    )
    rewrite_policy: RewritePolicy = setting(
        RewritePolicy.FORK,
        HISTORY,
        "what a harness's rewrite of a short answer does to the generated turn",
        into="manager",
    )
    train_constrained: ConstrainedPolicy = setting(
        ConstrainedPolicy.MASK,
        HISTORY,
        "tokens sampled under a grammar (a forced tool call), whose logprobs are the "
        "grammar's, not the policy's: mask them as `constrained` or train them (yes)",
        into="manager",
    )
    # -- sessions and retries
    retries: Retry = setting(
        _C.retry,
        SESSIONS,
        "a retried request: answer with the recorded reply (replay) or generate again (fresh); "
        "the X-Tokentrail-Retry header chooses per request",
        into="config.retry",
    )
    session_from_body: bool = setting(
        False,
        SESSIONS,
        "let OpenAI bodies (metadata.session_id, user) name the session instead of the API "
        "key: only when every client is trusted",
        into="config",
    )
    max_turns_per_session: int = setting(
        _C.max_turns_per_session, SESSIONS, "turns a session may take; 0: any", into="config"
    )
    max_context_tokens: int = setting(
        _C.max_context_tokens,
        SESSIONS,
        "a prompt over this is refused as too long, so a harness compacts (a rollout budget); "
        "0: the model's context",
        unit="tokens",
        into="config",
    )
    max_sessions: int = setting(
        _C.max_sessions, SESSIONS, "open sessions (503 past it); 0: no cap", into="config"
    )
    max_memory: int = setting(
        _C.max_memory, SESSIONS,
        "resident memory the adapter admits work up to: 429/529 with Retry-After past it; "
        "0: half the machine's (or its cgroup's limit)",
        unit="bytes", default_text="0 (half the machine's)", into="config",
    )  # fmt: skip
    session_idle_ttl: float = setting(
        _C.session_idle_ttl_s, SESSIONS, "evict sessions idle this long; 0: never", unit="s",
        into="config.session_idle_ttl_s", bounds=(0, MAX_SECONDS),
    )  # fmt: skip
    finish_retention: float = setting(
        _C.finish_retention_s, SESSIONS, "how long a finish is kept to answer a repeat", unit="s",
        into="config.finish_retention_s", bounds=(0, MAX_SECONDS),
    )  # fmt: skip
    exclude_system: list[str] = setting(
        [],
        SESSIONS,
        "exclude side conversations whose first message matches REGEX from training; "
        "repeatable (a JSON list in a variable)",
        metavar="REGEX",
    )
    exclude_side_requests: bool = setting(
        False,
        SESSIONS,
        "exclude the known side requests of Qwen Code (memory extraction), hermes-agent "
        "(context summarizer), opencode/kilo (title generator) and Claude Code (session "
        "title) from training; the ledger names the rule that fired",
        into="config.exclude_known_side_requests",
    )
    # -- limits (docs/operating/limits.md)
    max_body_bytes: int = setting(
        _L.max_body_bytes, LIMITS, "one request body (413 past it)", unit="bytes", into="limits"
    )
    max_json_depth: int = setting(
        _L.max_json_depth, LIMITS, "nesting of JSON values (400 past it)", into="limits"
    )
    max_messages: int = setting(_L.max_messages, LIMITS, "messages per request", into="limits")
    max_tools: int = setting(_L.max_tools, LIMITS, "tools per request", into="limits")
    max_tool_schema_bytes: int = setting(
        _L.max_tool_schema_bytes, LIMITS, "all tool schemas of a request", unit="bytes",
        into="limits",
    )  # fmt: skip
    max_prompt_tokens: int = setting(
        _L.max_prompt_tokens, LIMITS, "a prompt's length; 0: the model config's context",
        unit="tokens", into="limits",
    )  # fmt: skip
    max_output_tokens: int = setting(
        _L.max_output_tokens, LIMITS, "max_tokens above this is clamped", unit="tokens",
        into="limits",
    )  # fmt: skip
    max_header_bytes: int = setting(
        _L.max_header_bytes, LIMITS, "one request line or header line", unit="bytes",
        into="limits", bounds=(1024, None),
    )  # fmt: skip
    body_timeout: float = setting(
        _L.body_timeout_s, LIMITS, "time for a request body to arrive (408 after)", unit="s",
        into="limits.body_timeout_s", bounds=(0, MAX_SECONDS),
    )  # fmt: skip
    idle_connection_timeout: float = setting(
        _L.idle_connection_s, LIMITS, "time a connection may sit without a request", unit="s",
        into="limits.idle_connection_s", bounds=(0, MAX_SECONDS),
    )  # fmt: skip
    max_connections: int = setting(
        _L.max_connections, LIMITS, "open connections; 0: what the fd limit allows",
        into="limits",
    )  # fmt: skip
    max_concurrent_turns: int = setting(
        _L.max_concurrent_turns, LIMITS, "turns at once (503 + Retry-After past it)",
        into="limits",
    )  # fmt: skip
    max_image_bytes: int = setting(
        _I.max_image_bytes, LIMITS, "one image, decoded", unit="bytes",
        into="image_limits",
    )  # fmt: skip
    max_image_pixels: int = setting(
        _I.max_image_pixels, LIMITS, "one image's width x height", unit="pixels",
        into="image_limits",
    )  # fmt: skip
    max_request_image_bytes: int = setting(
        _I.max_request_bytes, LIMITS, "all of a request's images, decoded, each occurrence "
        "counted", unit="bytes", into="image_limits.max_request_bytes",
    )  # fmt: skip
    max_request_image_pixels: int = setting(
        _I.max_request_pixels, LIMITS, "all of a request's images' pixels, each occurrence "
        "counted", unit="pixels", into="image_limits.max_request_pixels",
    )  # fmt: skip
    # -- journal
    journal: str | None = setting(
        None, JOURNAL, "SQLite journal: recover from it, then append every turn", metavar="PATH",
        default_text="none (nothing survives a restart)",
    )  # fmt: skip
    journal_sync: SyncMode = setting(
        SyncMode.NORMAL, JOURNAL, "SQLite synchronous mode (full: survive a power loss too)"
    )
    # -- replay data
    routed_experts: bool = setting(
        False,
        REPLAY,
        "ask the engine for every turn's MoE routed experts and carry them in the samples",
        into="config",
    )
    indexer_topk: bool = setting(
        False,
        REPLAY,
        "ask the engine for every turn's sparse-attention indexer top-k (SGLang)",
        into="config",
    )
    model_config: str | None = setting(
        None, REPLAY, "the model's config.json (or its directory), for the replay shapes",
        metavar="PATH", default_text="the tokenizer's directory",
    )  # fmt: skip
    routing_shape: str | None = setting(
        None, REPLAY, "the routed experts' shape, over the model config's",
        metavar="LAYERS,TOP_K,NUM_EXPERTS", default_text="the model config's",
    )  # fmt: skip
    indexer_shape: str | None = setting(
        None, REPLAY, "the indexer top-k's shape, over the model config's",
        metavar="LAYERS,TOP_K", default_text="the model config's",
    )  # fmt: skip
    # -- streaming (docs/concepts/streaming.md)
    engine_stream: bool = setting(
        False,
        STREAMING,
        "stream from the engine (SGLang /generate, vLLM /v1/completions with stream: true; ids "
        "and logprobs taken from the stream) and to the harness as tokens are sampled",
        into="config.live_stream",
    )
    keepalive: float = setting(
        KEEPALIVE_S,
        STREAMING,
        "with --engine-stream, a keepalive (Anthropic ping, SSE comment) whenever nothing else "
        "went out for this long, so idle timeouts do not fire",
        unit="s",
        into="config.keepalive_s",
        bounds=(0.01, MAX_SECONDS),
    )
    # -- logging
    log_level: str | None = setting(
        None,
        LOGGING,
        "what the server logs: every 5xx it answers is a WARNING with its reason, session and "
        "engine request id; DEBUG adds each turn's details",
        choices=lambda: ["DEBUG", "INFO", "WARNING", "ERROR"],
        default_text="tokentrail --log-level's, WARNING",
    )
    access_log: str | None = setting(
        None,
        LOGGING,
        "one line per request (method, route, status, session, duration, prompt and output "
        "tokens) to FILE, or to stderr when no FILE (or -) is given",
        metavar="FILE",
        const="-",
        default_text="off",
    )
    access_log_json: bool = setting(
        False, LOGGING, "write the access log's lines as JSON objects, one a line"
    )


def add_command(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve the Anthropic/OpenAI adapter",
        description="Serve the Anthropic/OpenAI adapter. Each setting is a flag, a key of a "
        "--config TOML file (the flag without dashes) and a TOKENTRAIL_<NAME> variable; the "
        "flag wins, then the variable, then the file.",
    )
    settings.add_arguments(serve, ServeSettings)
    serve.set_defaults(func=_serve)


def resolve_settings(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> ServeSettings:
    """The settings `args` (parsed `serve` flags), the environment and `--config` give."""
    return settings.resolve(ServeSettings, args, environ).build(ServeSettings)


def _serve(args: argparse.Namespace) -> int:
    from tokentrail.adapter.server import serve_forever

    try:
        resolved = settings.resolve(ServeSettings, args)
        if args.print_config:
            print(settings.to_toml(resolved), end="")
            return 0
        s = resolved.build(ServeSettings)
        if s.log_level is not None:
            logging.getLogger().setLevel(s.log_level)
        # Before the tokenizer loads (seconds): an address it cannot listen on fails now.
        check_listen(s.host, s.port)
        adapter = build_adapter(s, resolved)
    except SettingError as exc:
        # A setting the operator gave is wrong: name it, no traceback (argparse's own code).
        print(f"tokentrail serve: {exc}", file=sys.stderr)
        return 2
    if adapter.config.admin_token is None:
        logging.getLogger(__name__).warning(
            "no --admin-token: the admin routes (finish, drop) are off over HTTP"
        )
    from tokentrail.adapter.memory import map_large_buffers

    # Freed bodies and images go back to the system (`adapter.memory`).
    map_large_buffers()
    logging.getLogger(__name__).info(
        "memory budget: %d MB (--max-memory)", adapter.memory.max_bytes >> 20
    )
    try:
        serve_forever(
            adapter,
            s.host,
            s.port,
            lambda url: print(f"tokentrail serving on {url}", flush=True),
        )
    except OSError as exc:  # taken between the check and the start
        print(f"tokentrail serve: {_listen_error(s.host, s.port, exc)}", file=sys.stderr)
        return 2
    return 0


def check_listen(host: str, port: int) -> None:
    """Raise `SettingError`, naming `--host` or `--port`, when `host:port` cannot be listened
    on (a port in use, an address not on this machine)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise SettingError(f"--host {host}: not an address to listen on ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        # As the server binds: a port in TIME_WAIT is free, one another process listens on not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise SettingError(_listen_error(host, port, exc)) from None


def _listen_error(host: str, port: int, exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    return (
        f"--port {port}: cannot listen on {host}:{port} ({reason}); allowed: a free port, "
        "0 to 65535 (0: any free one)"
    )


def build_adapter(s: ServeSettings, resolved: settings.Resolved) -> Adapter:
    """The adapter the settings describe. Raises `SettingError` naming the setting (its flag)
    and value that keeps it from starting: an engine spec, a tokenizer, a chat template, a
    journal, a pattern or a shape it cannot use."""
    import tokentrail.sim  # noqa: F401 - registers the simulated model as an engine
    from tokentrail.adapter.access_log import AccessLog
    from tokentrail.adapter.server import Adapter
    from tokentrail.engines import create_engine
    from tokentrail.engines.streaming import StreamingEngine
    from tokentrail.storage.journal import Journal
    from tokentrail.text.families import resolve_family
    from tokentrail.text.tokenizer import load_tokenizer
    from tokentrail.trajectory.manager import TrajectoryManager

    tool_parser = None if s.tool_parser == "none" else s.tool_parser
    reasoning_parser = None if s.reasoning_parser == "none" else s.reasoning_parser
    for pattern in s.exclude_system:
        with _naming("--exclude-system", pattern, re.error):
            re.compile(pattern)
    config = AdapterConfig(
        access_log=None if s.access_log is None else AccessLog(s.access_log, s.access_log_json),
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        limits=Limits(**resolved.into("limits")),
        image_limits=ImageLimits(**resolved.into("image_limits")),
        exclude_patterns=tuple(s.exclude_system),
        **resolved.into("config"),
    )
    # What fails fast first, then the tokenizer (seconds to load), then what needs it.
    template = None
    if s.chat_template is not None:
        with _naming("--chat-template", s.chat_template):
            # Compiled and rendered by the adapter, in a child under the template budget first.
            template = Path(s.chat_template).read_text("utf-8")
    routing, indexer = replay_shapes(s)
    with _naming("--tokenizer", s.tokenizer):
        tokenizer = load_tokenizer(s.tokenizer)
    with _naming("--chat-template" if template else "--tokenizer", s.chat_template or s.tokenizer):
        fam = resolve_family(tokenizer, template)
    print(
        f"model family {fam.name}: tool parser "
        f"{fam.tool_parser if tool_parser == 'auto' else tool_parser}, reasoning parser "
        f"{fam.reasoning_parser if reasoning_parser == 'auto' else reasoning_parser}"
    )
    manager = TrajectoryManager(
        backend=s.backend, routing=routing, indexer=indexer, **resolved.into("manager")
    )
    with _naming("--engine", s.engine):
        engine = create_engine(s.engine, tokenizer, timeout=s.engine_timeout)
    if s.engine_stream and isinstance(engine, StreamingEngine):
        engine.stream = True
    journal = None
    if s.journal is not None:
        with _naming("--journal", s.journal, sqlite3.Error):
            journal = Journal(s.journal, sync=s.journal_sync)
    # The adapter renders a one-message conversation with the template before it serves.
    with _naming("--chat-template" if template else "--tokenizer", s.chat_template or s.tokenizer):
        return Adapter(
            engine=engine,
            tokenizer=tokenizer,
            chat_template=template,
            template_name=f"--chat-template {s.chat_template}" if template else None,
            manager=manager,
            config=config,
            journal=journal,
        )


@contextmanager
def _naming(flag: str, value: str, *more: type[Exception]) -> Iterator[None]:
    """Bad input or an unreadable file inside, as a `SettingError` naming the flag and value."""
    from tokentrail.errors import JournalError

    caught: tuple[type[Exception], ...] = (TokentrailError, OSError, UnicodeDecodeError, *more)
    try:
        yield
    except JournalError:
        raise  # a journal another process holds: its own message, its own exit code
    except caught as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if reason.startswith(f"{flag} "):  # it names the flag itself ("--chat-template X was")
            raise SettingError(reason) from None
        raise SettingError(f"{flag} {value}: {reason}") from None


def replay_shapes(s: ServeSettings) -> tuple[Any, Any]:
    """The routing and indexer shapes `--routed-experts` / `--indexer-topk` need: the flags'
    own, else the model's config.json (`--model-config`, else the tokenizer's directory)."""
    from tokentrail.core.routing import (
        IndexerShape,
        RoutingShape,
        model_shapes,
        read_model_config,
    )

    with _naming("--routing-shape", str(s.routing_shape)):
        routing = RoutingShape.parse(s.routing_shape) if s.routing_shape else None
    with _naming("--indexer-shape", str(s.indexer_shape)):
        indexer = IndexerShape.parse(s.indexer_shape) if s.indexer_shape else None
    wanted = (s.routed_experts and routing is None) or (s.indexer_topk and indexer is None)
    if wanted:
        source = s.model_config or (s.tokenizer if Path(s.tokenizer).is_dir() else None)
        if source is None:
            raise SettingError(
                "--routed-experts and --indexer-topk need the model's shape: "
                "--model-config DIR, a model directory as --tokenizer, or --routing-shape "
                "LAYERS,TOP_K,NUM_EXPERTS / --indexer-shape LAYERS,TOP_K"
            )
        with _naming("--model-config", source):
            from_config = model_shapes(read_model_config(source))
        routing, indexer = routing or from_config[0], indexer or from_config[1]
        for flag, shape, name in (
            (s.routed_experts, routing, "routed experts"),
            (s.indexer_topk, indexer, "indexer top-k"),
        ):
            if flag and shape is None:
                raise SettingError(f"--model-config {source}: the model config has no {name}")
    return (routing if s.routed_experts else None), (indexer if s.indexer_topk else None)
