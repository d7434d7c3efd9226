"""`tokentrail serve`: the adapter over HTTP, with its settings.

The settings are `ServeSettings`: the serve-only ones declared here, and the sections it nests,
whose settings are declared on the dataclasses that hold them (`AdapterConfig` with its
`Limits` and `ImageLimits`, `ManagerPolicies`). Each field made with `setting(...)` gives its
flag, `--config` key and `TOKENTRAIL_*` variable, its group in `--help`, default and unit.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from tokentrail.cli import settings
from tokentrail.errors import SettingError, TokentrailError
from tokentrail.kinds import Backend, SettingGroup, SyncMode
from tokentrail.setting import MAX_SECONDS, section, setting
from tokentrail.trajectory.policies import ManagerPolicies

if TYPE_CHECKING:
    from tokentrail.adapter import Adapter

SERVER, ENGINE, JOURNAL = SettingGroup.SERVER, SettingGroup.ENGINE, SettingGroup.JOURNAL
REPLAY, LOGGING = SettingGroup.REPLAY, SettingGroup.LOGGING


@dataclass
class ServeSettings:
    """Every `tokentrail serve` setting; within a group, `--help` shows them in this order
    (a section's where the section stands)."""

    # -- server
    host: str = setting("127.0.0.1", SERVER, "address to listen on")
    port: int = setting(8300, SERVER, "TCP port to listen on", metavar="PORT", bounds=(0, 65535))
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
    # The adapter's own settings: server, engine, history, sessions, limits, replay, streaming.
    config: AdapterConfig = section(AdapterConfig)
    backend: Backend | None = setting(
        None, ENGINE, "the hot path's implementation", default_text="$TOKENTRAIL_BACKEND, else rust"
    )
    engine_timeout: float = setting(
        600.0, ENGINE, "time an engine call may take (502 after)", unit="s",
        bounds=(0.001, MAX_SECONDS),
    )  # fmt: skip
    # The trajectory manager's: drift, rewrites, constrained tokens (history and splicing).
    manager: ManagerPolicies = section(ManagerPolicies)
    # -- journal
    journal: str | None = setting(
        None, JOURNAL, "SQLite journal: recover from it, then append every turn", metavar="PATH",
        default_text="none (nothing survives a restart)",
    )  # fmt: skip
    journal_sync: SyncMode = setting(
        SyncMode.NORMAL, JOURNAL, "SQLite synchronous mode (full: survive a power loss too)"
    )
    # -- replay data
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
    from tokentrail.adapter import serve_forever
    from tokentrail.adapter.http.memory import map_large_buffers

    # Freed bodies and images go back to the system (`adapter.http.memory`); before the
    # tokenizer's threads or the workers start.
    map_large_buffers()
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
        adapter = build_adapter(s)
    except SettingError as exc:
        # A setting the operator gave is wrong: name it, no traceback (argparse's own code).
        print(f"tokentrail serve: {exc}", file=sys.stderr)
        return 2
    if adapter.config.admin_token is None:
        logging.getLogger(__name__).warning(
            "no --admin-token: the admin routes (finish, drop) are off over HTTP"
        )
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


def build_adapter(s: ServeSettings) -> Adapter:
    """The adapter the settings describe. Raises `SettingError` naming the setting (its flag)
    and value that keeps it from starting: an engine spec, a tokenizer, a chat template, a
    journal, a pattern or a shape it cannot use."""
    import tokentrail.sim  # noqa: F401 - registers the simulated model as an engine
    from tokentrail.adapter import Adapter
    from tokentrail.adapter.http.access_log import AccessLog
    from tokentrail.engines import create_engine
    from tokentrail.engines.streaming import StreamingEngine
    from tokentrail.storage.journal import Journal
    from tokentrail.text.families import resolve_family
    from tokentrail.text.tokenizer import load_tokenizer
    from tokentrail.trajectory.manager import TrajectoryManager

    for pattern in s.config.exclude_patterns:
        with _naming("--exclude-system", pattern, re.error):
            re.compile(pattern)
    access_log = None if s.access_log is None else AccessLog(s.access_log, s.access_log_json)
    config = dataclasses.replace(s.config, access_log=access_log)
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
    tool_parser, reasoning_parser = config.tool_parser or "none", config.reasoning_parser or "none"
    print(
        f"model family {fam.name}: tool parser "
        f"{fam.tool_parser if tool_parser == 'auto' else tool_parser}, reasoning parser "
        f"{fam.reasoning_parser if reasoning_parser == 'auto' else reasoning_parser}"
    )
    manager = TrajectoryManager(
        backend=s.backend, routing=routing, indexer=indexer, **dataclasses.asdict(s.manager)
    )
    with _naming("--engine", s.engine):
        engine = create_engine(s.engine, tokenizer, timeout=s.engine_timeout)
    if config.live_stream and isinstance(engine, StreamingEngine):
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
    wanted = (s.config.routed_experts and routing is None) or (
        s.config.indexer_topk and indexer is None
    )
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
            (s.config.routed_experts, routing, "routed experts"),
            (s.config.indexer_topk, indexer, "indexer top-k"),
        ):
            if flag and shape is None:
                raise SettingError(f"--model-config {source}: the model config has no {name}")
    return (routing if s.config.routed_experts else None), (
        indexer if s.config.indexer_topk else None
    )
