"""`tokentrail doctor`: what a first `serve` needs, checked one line each.

The tokenizer loads; the engine answers a one-token generation through tokentrail's own client
for it (SGLang `/generate` with token ids and logprobs, vLLM `/v1/completions` with
`return_token_ids`) with ids the tokenizer's vocabulary holds; the chat template's family is
detected and splices (`check-template`); the journal path is writable; the admin token is set.
It reads the same settings as `serve` (flags, `TOKENTRAIL_*`, `--config`). Exit 1 if a check
fails; a warning alone does not fail.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokentrail.cli import settings
from tokentrail.cli.serve import ServeSettings
from tokentrail.errors import EngineError, SettingError, TokentrailError
from tokentrail.kinds import Verdict

# The settings `doctor` takes as flags (the rest still come from the environment and --config).
FLAGS = ("engine", "tokenizer", "chat_template", "journal", "admin_token", "engine_timeout")
# A short prompt the engine is asked to continue by one token.
PROBE = "The capital of France is"
# How long one check may take: a one-token generation answers in well under this once the
# engine is up; one that does not answer by then will not answer a harness either.
CHECK_TIMEOUT_S = 30.0


@dataclass
class Check:
    what: str
    verdict: Verdict
    detail: str

    def line(self) -> str:
        return f"{self.verdict.value:<5} {self.what:<9} {self.detail}"


def add_command(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="check the engine, tokenizer, template, journal and admin token a serve needs",
        description=__doc__,
    )
    settings.add_arguments(doctor, ServeSettings, only=FLAGS)
    doctor.add_argument(
        "--check-timeout",
        type=_seconds,
        default=CHECK_TIMEOUT_S,
        metavar="SECONDS",
        help="time one check may take before it fails (an engine that accepts a connection "
        f"and never answers) (default: {CHECK_TIMEOUT_S:g} s)",
    )
    doctor.set_defaults(func=_doctor)


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"{raw} is out of range; allowed: more than 0 to 3600")
    return value


def _doctor(args: argparse.Namespace) -> int:
    try:
        resolved = settings.resolve(ServeSettings, args)
    except SettingError as exc:
        print(f"tokentrail doctor: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(settings.to_toml(resolved), end="")
        return 0
    s = resolved.build(ServeSettings)
    checks = run_checks(s, check_timeout_s=args.check_timeout)
    for check in checks:
        print(check.line(), flush=True)
    failed = [c for c in checks if c.verdict is Verdict.FAIL]
    print(f"{len(failed)} of {len(checks)} checks failed" if failed else "ready to serve")
    return 1 if failed else 0


def run_checks(s: ServeSettings, check_timeout_s: float = CHECK_TIMEOUT_S) -> list[Check]:
    """Every check, in order; a check that needs what an earlier one could not load is a skip.
    The engine's check fails after `check_timeout_s` without an answer."""
    from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer

    checks: list[Check] = []
    tokenizer: LoadedTokenizer | None = None
    try:
        tokenizer = load_tokenizer(s.tokenizer)
        family = f", family {tokenizer.family}" if tokenizer.family else ""
        checks.append(
            Check("tokenizer", Verdict.OK, f"{s.tokenizer}: {tokenizer.vocab_size} ids{family}")
        )
    except (TokentrailError, OSError) as exc:
        checks.append(Check("tokenizer", Verdict.FAIL, f"--tokenizer {s.tokenizer}: {exc}"))
    if tokenizer is None:
        checks.append(Check("engine", Verdict.SKIP, "needs a tokenizer to encode a prompt"))
        checks.append(Check("template", Verdict.SKIP, "needs a tokenizer"))
    else:
        checks.append(
            _guard("engine", s.engine, lambda: check_engine(s, tokenizer, check_timeout_s))
        )
        checks.append(
            _guard("template", s.chat_template or s.tokenizer, lambda: check_template(s, tokenizer))
        )
    checks.append(check_journal(s.journal))
    if s.config.admin_token:
        checks.append(Check("admin", Verdict.OK, "admin token set: finish and drop work over HTTP"))
    else:
        checks.append(
            Check(
                "admin",
                Verdict.WARN,
                "no --admin-token (nor TOKENTRAIL_ADMIN_TOKEN): finish and drop are off over "
                "HTTP, so a trainer cannot collect samples from it",
            )
        )
    return checks


def _guard(what: str, value: str | None, check: Callable[[], Check]) -> Check:
    try:
        return check()
    except (TokentrailError, OSError) as exc:
        said = str(exc)
        named = value is not None and said.startswith(value)
        return Check(what, Verdict.FAIL, said if named else f"{value}: {said}")


def check_engine(s: ServeSettings, tokenizer: Any, timeout_s: float = CHECK_TIMEOUT_S) -> Check:
    """One short generation through tokentrail's client for the engine: it answers, in the wire
    format the client reads (ids, one logprob each), with ids inside the vocabulary, within
    `timeout_s` (or `--engine-timeout`, if shorter)."""
    import tokentrail.sim  # noqa: F401 - registers the simulated model as an engine
    from tokentrail.engines import GenerateRequest, SamplingParams, create_engine

    engine = create_engine(s.engine, tokenizer, timeout=s.engine_timeout)
    prompt = tokenizer.encode(PROBE)
    req = GenerateRequest(prompt, SamplingParams(max_new_tokens=1, temperature=0.0), "doctor")

    limit = min(timeout_s, s.engine_timeout)

    async def once() -> Any:
        try:
            return await asyncio.wait_for(engine.generate(req), limit)
        finally:
            await engine.close()

    start = time.perf_counter()
    try:
        gen = asyncio.run(once())
    except EngineError as exc:
        return Check("engine", Verdict.FAIL, f"{s.engine}: {exc}")
    except asyncio.TimeoutError:
        return Check(
            "engine",
            Verdict.FAIL,
            f"{s.engine}: no answer to a one-token generation within {limit:g} s "
            "(--check-timeout): the engine accepts connections but does not answer (still "
            "loading, or stuck)",
        )
    took = time.perf_counter() - start
    outside = [t for t in gen.output_ids if not 0 <= t < tokenizer.vocab_size]
    if outside:
        return Check(
            "engine",
            Verdict.FAIL,
            f"{s.engine} sampled id {outside[0]}, outside the tokenizer's {tokenizer.vocab_size} "
            "ids: the engine serves another model than --tokenizer",
        )
    if not gen.output_ids:
        return Check("engine", Verdict.FAIL, f"{s.engine} answered no token ({gen.finish_reason})")
    return Check(
        "engine",
        Verdict.OK,
        f"{s.engine} ({engine.name}): {len(prompt)} prompt ids in, {len(gen.output_ids)} id "
        f"{gen.output_ids[0]} with logprob {gen.logprobs[0]:.3g} out, in {took:.2f} s; ids "
        f"within the tokenizer's {tokenizer.vocab_size}",
    )


def check_template(s: ServeSettings, tokenizer: Any) -> Check:
    """The template (the override, else the tokenizer's) compiles, its family is detected, and
    every boundary `check-template` tries can be spliced."""
    from tokentrail.adapter import Adapter
    from tokentrail.engines.scripted import ScriptedEngine
    from tokentrail.text.families import resolve_family
    from tokentrail.trajectory.splice import check_template as boundaries

    template = Path(s.chat_template).read_text("utf-8") if s.chat_template else None
    source = s.chat_template or f"{s.tokenizer}'s chat template"
    fam = resolve_family(tokenizer, template)
    # The template checks serve starts with: its startup renders in a child under the template
    # budget, then here (an adapter that is not served).
    Adapter(
        engine=ScriptedEngine(tokenizer),
        tokenizer=tokenizer,
        chat_template=template,
        template_name=source,
    )
    reports = boundaries(tokenizer, template, fam)
    failing = [r for r in reports if not r.splice]
    if failing:
        names = ", ".join(f"{r.name} ({r.fallback})" for r in failing)
        return Check(
            "template",
            Verdict.WARN,
            f"{source}: family {fam.name}; falls back to a full render at {names} "
            "(correct, slower: `tokentrail check-template`)",
        )
    return Check(
        "template",
        Verdict.OK,
        f"{source}: family {fam.name}; splices at all {len(reports)} boundaries",
    )


# The first bytes of every SQLite database file.
_SQLITE_HEADER = b"SQLite format 3\x00"


def check_journal(journal: str | None) -> Check:
    """The journal file can be written: a SQLite database (or an empty file) that is a
    regular file, or a file that can be made in an existing, writable directory."""
    if journal is None:
        return Check("journal", Verdict.WARN, "no --journal: sessions do not survive a restart")
    path = Path(journal)
    target = path if path.exists() else path.parent
    if not target.exists():
        return Check("journal", Verdict.FAIL, f"--journal {journal}: {target} does not exist")
    if path.is_dir():
        return Check("journal", Verdict.FAIL, f"--journal {journal}: is a directory")
    if path.exists():
        problem = _not_a_journal(path)
        if problem is not None:
            return Check("journal", Verdict.FAIL, f"--journal {journal}: {problem}")
    elif not target.is_dir():
        return Check("journal", Verdict.FAIL, f"--journal {journal}: {target} is not a directory")
    if not os.access(target, os.W_OK):
        return Check("journal", Verdict.FAIL, f"--journal {journal}: {target} is not writable")
    state = "exists; serve recovers from it" if path.exists() else "will be created"
    return Check("journal", Verdict.OK, f"{journal}: writable ({state})")


def _not_a_journal(path: Path) -> str | None:
    """Why an existing `path` cannot hold a journal (None: it can): a device, a pipe or a
    kernel file (`/proc/self/mem`) is not a regular file that holds what is written to it."""
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            return "is not a regular file (a journal is a SQLite database file)"
        with path.open("rb") as f:
            head = f.read(len(_SQLITE_HEADER))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if head == b"" and path.stat().st_size == 0:
        return None  # an empty file: SQLite makes the database in it
    if not head.startswith(_SQLITE_HEADER):
        return "is not a SQLite database (a journal is one; give a new file's path)"
    return None
