"""Every `tokentrail` command the docs and the README show is one the CLI takes: each shell
block's `tokentrail ...` and `python -m tokentrail.model.tiny ...` lines are parsed by the real
argument parsers, and each `tokentrail SUBCOMMAND --flag` the prose quotes names a subcommand
and flags that exist, so a renamed or removed flag fails here, not on a user's first try.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokentrail.cli import build_parser
from tokentrail.model import tiny

ROOT = Path(__file__).parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
BLOCK = re.compile(r"^ *```(?:bash|sh|shell|console)\n(.*?)^ *```", re.M | re.S)
# Where a command ends on its line.
OPERATORS = frozenset({"|", "||", "&&", ";", "&", ">", ">>", "<", "(", ")"})
ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
# The commands a page may show, each with the parser that reads its arguments.
PROGRAMS: dict[tuple[str, ...], argparse.ArgumentParser] = {
    ("tokentrail",): build_parser(),
    ("python", "-m", "tokentrail"): build_parser(),
    ("python", "-m", "tokentrail.model.tiny"): tiny.parser(),
}


def shell_lines(text: str) -> Iterator[str]:
    """The logical lines of a page's shell blocks: continuations joined, comments dropped."""
    for block in BLOCK.finditer(text):
        lines = [line.strip() for line in block.group(1).replace("\\\n", " ").splitlines()]
        yield from (line for line in lines if line and not line.startswith("#"))


def commands(line: str) -> Iterator[tuple[tuple[str, ...], list[str]]]:
    """Each (program, arguments) a line runs: a program where a command starts (after an
    operator and any `NAME=value` assignments), its arguments up to the next operator."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    words = list(lexer)
    starts = True
    for i, word in enumerate(words):
        if word in OPERATORS or word == "$(":
            starts = True
            continue
        if not starts or ASSIGNMENT.match(word):
            continue
        starts = False
        for program in PROGRAMS:
            end = i + len(program)
            if tuple(_name(w) for w in words[i:end]) == program:
                args = []
                for arg in words[end:]:
                    if arg in OPERATORS:
                        break
                    args.append(arg)
                yield program, args


def _name(word: str) -> str:
    """A program's name without its directory (`.venv/bin/tokentrail`), `python3` as `python`."""
    name = word.rsplit("/", 1)[-1]
    return "python" if re.fullmatch(r"python3(\.\d+)?", name) else name


def shown() -> list[tuple[str, tuple[str, ...], list[str]]]:
    found = []
    for page in PAGES:
        for line in shell_lines(page.read_text("utf-8")):
            for program, args in commands(line):
                found.append((str(page.relative_to(ROOT)), program, args))
    return found


SHOWN = shown()


def test_the_getting_started_page_shows_the_whole_path() -> None:
    on_page = {
        (program, args[0] if args else "")
        for page, program, args in SHOWN
        if page == "docs/getting-started.md"
    }
    for step in ("doctor", "serve", "view", "journal"):
        assert (("tokentrail",), step) in on_page, step
    assert (("python", "-m", "tokentrail.model.tiny"), "qwen3") in on_page


@pytest.mark.parametrize(
    ("page", "program", "args"),
    SHOWN,
    ids=[f"{page}:{' '.join(program + tuple(args[:1]))}" for page, program, args in SHOWN],
)
def test_every_command_the_docs_show_parses(
    page: str, program: tuple[str, ...], args: list[str]
) -> None:
    parser = PROGRAMS[program]
    try:
        parser.parse_args(args)
    except SystemExit as exc:  # argparse's way to refuse an argument (0: `--help` shown)
        if exc.code != 0:
            pytest.fail(f"{page}: `{' '.join(program)} {shlex.join(args)}` does not parse")


# `tokentrail SUBCOMMAND ...` quoted in prose: often elided (`--engine sglang://...`), so only
# its subcommand and its `--flags` are checked.
INLINE = re.compile(r"`tokentrail ([a-z][a-z-]*)((?: [^`]*)?)`")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def quoted() -> list[tuple[str, str, list[str]]]:
    found = []
    for page in PAGES:
        text = BLOCK.sub("", page.read_text("utf-8")).replace("\n", " ")
        for match in INLINE.finditer(text):
            flags = re.findall(r"(?<![\w-])--[a-z][a-z-]*", match.group(2))
            found.append((str(page.relative_to(ROOT)), match.group(1), flags))
    return found


QUOTED = quoted()


@pytest.mark.parametrize(
    ("page", "command", "flags"),
    QUOTED,
    ids=[f"{page}:{command}" for page, command, _ in QUOTED],
)
def test_every_command_the_prose_quotes_exists(page: str, command: str, flags: list[str]) -> None:
    commands = subcommands(build_parser())
    assert command in commands, f"{page}: `tokentrail {command}` is no subcommand"
    parser = commands[command]
    known = {o for a in parser._actions for o in a.option_strings}
    for sub in subcommands(parser).values():  # `journal export`, ...: their flags too
        known |= {o for a in sub._actions for o in a.option_strings}
    for flag in flags:
        assert flag in known, f"{page}: `tokentrail {command}` has no {flag}"


def test_a_renamed_flag_fails_the_check() -> None:
    (line,) = shell_lines(
        "```bash\ntokentrail serve --engine simulated \\\n    --jornal x.db\n```\n"
    )
    ((program, args),) = commands(line)
    with pytest.raises(SystemExit):
        PROGRAMS[program].parse_args(args)
