"""`tokentrail view PATH`: a journal's sessions in the browser (one local page, nothing from the
network), read again as the journal grows; or exported samples (.jsonl, .npz, .parquet).

It is behind a token, printed at start in the URL to open (as Jupyter does), and answers only
requests whose `Host` is an address, localhost, this machine's name or an `--allow-host` name
(`view.access`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

logger = logging.getLogger(__name__)

TOKEN_ENV = "TOKENTRAIL_VIEW_TOKEN"


def add_command(sub: Any) -> None:
    view = sub.add_parser(
        "view", help="see a journal's sessions, trees and every token's fate in the browser"
    )
    view.add_argument(
        "path", help="a journal (tokentrail serve --journal PATH), or exported samples"
    )
    view.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1; any other is reachable from the "
        "network over plain HTTP, behind the token)",
    )
    view.add_argument("--port", type=int, default=8765, help="0: any free port")
    view.add_argument(
        "--tokenizer",
        default=None,
        help="to show tokens as text (default: the one a journal names; samples: ids only)",
    )
    view.add_argument(
        "--token",
        default=None,
        help=f"the token the page and API need (default: ${TOKEN_ENV}, else a new random one, "
        "printed at start in the URL to open)",
    )
    view.add_argument(
        "--no-token",
        action="store_true",
        help="serve without a token: on a loopback --host only",
    )
    view.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the viewer may be opened under, beyond addresses, localhost and "
        "this machine's name (a DNS rebinding guard refuses the rest); repeat for more",
    )
    view.set_defaults(func=_view)


async def _serve(args: argparse.Namespace, token: str | None) -> None:
    from aiohttp import web

    from tokentrail.text.tokenizer import load_tokenizer
    from tokentrail.view.access import ViewAccess
    from tokentrail.view.app import standalone_app
    from tokentrail.view.samples import SamplesSource, is_sample_file
    from tokentrail.view.sources import JournalSource, SessionSource

    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    source: SessionSource
    if is_sample_file(args.path):
        source = SamplesSource(args.path, tokenizer)
    else:
        source = JournalSource(args.path, tokenizer)
    access = ViewAccess(token, args.allow_host)
    runner = web.AppRunner(standalone_app(source, access), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else args.port
    shown = "localhost" if args.host in ("0.0.0.0", "::") else args.host
    query = f"?token={token}" if token else ""
    print(f"tokentrail view: http://{shown}:{port}/{query} ({len(source.summaries())} sessions)")
    print("press Ctrl+C to stop", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def _view(args: argparse.Namespace) -> int:
    from tokentrail.view.access import is_loopback, new_token

    loopback = is_loopback(args.host)
    if args.no_token and not loopback:
        print(
            f"tokentrail view: --no-token with --host {args.host}: a viewer reachable from the "
            "network needs its token; drop --no-token (or listen on 127.0.0.1)",
            file=sys.stderr,
        )
        return 2
    token = None if args.no_token else (args.token or os.environ.get(TOKEN_ENV) or new_token())
    if not loopback:
        logger.warning(
            "tokentrail view listens on %s: reachable from the network, over plain HTTP (the "
            "token travels unencrypted); prefer 127.0.0.1 and an SSH tunnel",
            args.host,
        )
    try:
        asyncio.run(_serve(args, token))
    except KeyboardInterrupt:
        pass
    return 0
