"""`tokentrail view PATH`: a journal's sessions in the browser (one local page, nothing from the
network), read again as the journal grows; or exported samples (.jsonl, .npz, .parquet)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any


def add_command(sub: Any) -> None:
    view = sub.add_parser(
        "view", help="see a journal's sessions, trees and every token's fate in the browser"
    )
    view.add_argument(
        "path", help="a journal (tokentrail serve --journal PATH), or exported samples"
    )
    view.add_argument("--host", default="127.0.0.1")
    view.add_argument("--port", type=int, default=8765, help="0: any free port")
    view.add_argument(
        "--tokenizer",
        default=None,
        help="to show tokens as text (default: the one a journal names; samples: ids only)",
    )
    view.set_defaults(func=_view)


async def _serve(args: argparse.Namespace) -> None:
    from aiohttp import web

    from tokentrail.text.tokenizer import load_tokenizer
    from tokentrail.view.app import standalone_app
    from tokentrail.view.samples import SamplesSource, is_sample_file
    from tokentrail.view.sources import JournalSource, SessionSource

    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    source: SessionSource
    if is_sample_file(args.path):
        source = SamplesSource(args.path, tokenizer)
    else:
        source = JournalSource(args.path, tokenizer)
    runner = web.AppRunner(standalone_app(source), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else args.port
    print(f"tokentrail view: http://{args.host}:{port}/ ({len(source.summaries())} sessions)")
    print("press Ctrl+C to stop", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def _view(args: argparse.Namespace) -> int:
    try:
        asyncio.run(_serve(args))
    except KeyboardInterrupt:
        pass
    return 0
