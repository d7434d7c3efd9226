"""`tokentrail replay`, `audit` and `journal`: what a journal (or a file of `/finish`
answers) holds, re-linearized, gated on, checked, compacted and exported."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tokentrail.cli import recompute
from tokentrail.cli.names import names as _names
from tokentrail.errors import PolicyError
from tokentrail.kinds import DriftPolicy, History, Restore, RewritePolicy, parse_kind


def add_command(sub: Any) -> None:
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
    aud.add_argument(
        "target",
        help="a journal, or a JSON/JSONL of /finish answers (with --recompute: or a sample file)",
    )
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
    recompute.add_flags(aud)
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


def _replay(args: argparse.Namespace) -> int:
    from tokentrail.storage.journal.read import read_journal
    from tokentrail.storage.replay import Settings, as_recorded, progress_bar, replay, side_by_side
    from tokentrail.text.tokenizer import load_tokenizer

    contents = read_journal(args.journal)
    recorded = Settings.recorded(contents.meta)
    settings = Settings(
        restore=parse_kind(Restore, args.restore or recorded.restore, "restore mode"),
        history=parse_kind(History, args.history or recorded.history, "history mode"),
        drift_policy=parse_kind(
            DriftPolicy, args.drift_policy or recorded.drift_policy, "drift policy", PolicyError
        ),
        rewrite_policy=parse_kind(
            RewritePolicy,
            args.rewrite_policy or recorded.rewrite_policy,
            "rewrite policy",
            PolicyError,
        ),
        fork_threshold=recorded.fork_threshold,
        train_constrained=recorded.train_constrained,
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
    if args.recompute:
        return recompute.run(args)
    from tokentrail.storage.replay import audit_table, lost_table
    from tokentrail.trajectory.ledger import Ledger

    path = Path(args.target)
    named: dict[str, Ledger] = {}
    if path.suffix in (".json", ".jsonl"):
        for i, line in enumerate(path.read_text().splitlines()):
            if line.strip():
                record = json.loads(line)
                name = str(record.get("session") or f"line {i + 1}")
                if "ledger" not in record and "turns" not in record:
                    # An error answer saved in place of a finish answer (a 404, a 409): no
                    # session to count, so no gate to pass.
                    error = record.get("error")
                    what = error.get("message") if isinstance(error, dict) else None
                    what = what or "not a /finish answer"
                    print(f"tokentrail audit: {path}, {name}: no ledger: {what}", file=sys.stderr)
                    return 1
                named[name] = Ledger.from_dict(record.get("ledger", record))
    else:
        from tokentrail.storage.journal.read import read_journal
        from tokentrail.storage.replay import as_recorded

        named = {sid: t.ledger for sid, t in as_recorded(read_journal(path)).items()}
    ledgers = list(named.values())
    table, fraction = audit_table(ledgers)
    print(table)
    failed = fraction > args.max_masked
    if failed:
        print(f"FAIL: masked fraction {fraction:.4f} is above {args.max_masked}")
    else:
        print(f"ok: masked fraction {fraction:.4f} is within {args.max_masked}")
    lost_lines, damaged = lost_table(named)
    print(lost_lines)
    if damaged:
        print(f"FAIL: {damaged} sessions lost journaled turns (their samples are not whole)")
        failed = True
    if args.require_routing:
        from tokentrail.storage.replay import replay_table

        replay_lines, complete = replay_table(ledgers)
        print(replay_lines)
        if not complete:
            print("FAIL: replay rows are incomplete (--require-routing)")
            failed = True
    return 1 if failed else 0


def _journal_check(args: argparse.Namespace) -> int:
    from tokentrail.storage.journal.read import check_journal

    report = check_journal(args.journal)
    print(report.table())
    return 0 if report.ok else 1


def _journal_compact(args: argparse.Namespace) -> int:
    from tokentrail.storage.journal.compact import compact

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
    from tokentrail.storage.journal.compact import export_finished

    done = export_finished(args.journal, args.out)
    print(f"wrote {done.samples} samples of {done.sessions} finished sessions to {args.out}")
    for line in done.damaged:
        print(f"damaged: {line}")
    return 0 if not done.damaged else 1
