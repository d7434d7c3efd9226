"""The `tokentrail` command: `serve` the adapter, `replay`/`audit`/`journal` its records,
`pack` samples as prefix trees, run the `demo`.

`tokentrail demo` is the main job on built-in defaults: the scripted engine, the Qwen3
vocabulary and a harness that re-renders echoes as Claude Code does; no GPU, no network.
`tokentrail demo --family NAME` runs it for another model family (its vocabulary, template and
output format).
"""

from __future__ import annotations

import argparse
import logging
import sys

from tokentrail.cli import demo, pack, records, serve, view


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokentrail", description=__doc__)
    parser.add_argument(
        "--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default) or ERROR"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve.add_command(sub)
    demo.add_command(sub)
    records.add_command(sub)
    pack.add_command(sub)
    view.add_command(sub)
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
