"""The `tokentrail serve` settings reference page, written from `ServeSettings`.

    python -m tokentrail.cli.settings_doc [--check] [PATH]

writes the page the docs site shows (`docs/operating/settings-reference.md`); `--check` exits 1
when the page there is not what the settings say today. Nothing in it is typed by hand: the
name, default, unit, variable and help of each setting are its `setting(...)` field's, on
`ServeSettings` or a dataclass it nests (`AdapterConfig`, `Limits`, `ImageLimits`,
`ManagerPolicies`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokentrail.cli.settings import Field, fields_of
from tokentrail.kinds import SettingGroup

PAGE = Path("docs/operating/settings-reference.md")

_HEAD = """\
<!-- Written by `python -m tokentrail.cli.settings_doc` from ServeSettings (cli/serve.py) and
     the dataclasses it nests; do not edit: a test fails when it is not current. -->
# `tokentrail serve` settings reference

Every setting is a flag, a key of a `--config FILE.toml` file (the flag without its dashes; a
file may group keys in tables such as `[limits]`) and a `TOKENTRAIL_<NAME>` variable (a
repeatable flag's variable is a JSON list). The flag wins, then the variable, then the file, then
the default. `tokentrail serve --help` prints the same, one line each; `serve --print-config`
prints the resolved settings as a file, each with where it came from. How to use them:
[Settings](settings.md).
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(f: Field) -> str:
    choices = f.choices()
    value = f" `{f.metavar(choices)}`" if f.kind is not bool and f.metavar(choices) else ""
    flag = f"`{f.flag}`{value}" + (" (repeatable)" if f.listed else "")
    if f.kind is bool:
        flag = f"`{f.flag}` / `--no-{f.key}`"
    unit = f.info.unit if f.has_unit() else ""
    # A value is code; a default told in words ("the model's") is not.
    default = f.default_shown() if f.info.default_text is not None else f"`{f.default_shown()}`"
    cells = [flag, default, unit, f"`{f.env}`", f.info.help]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def markdown(cls: type) -> str:
    """The reference page for a settings dataclass: one table per group, in `--help`'s order."""
    fields = fields_of(cls)
    out = [_HEAD]
    for group in SettingGroup:
        chosen = [f for f in fields if f.info.group is group]
        if not chosen:
            continue
        out += [
            f"## {group.value[:1].upper()}{group.value[1:]}",
            "",
            "| setting | default | unit | variable | what it does |",
            "|---|---|---|---|---|",
            *(_row(f) for f in chosen),
            "",
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from tokentrail.cli.serve import ServeSettings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", nargs="?", type=Path, default=PAGE)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is not current")
    args = parser.parse_args(argv)
    page = markdown(ServeSettings)
    if args.check:
        current = args.path.read_text("utf-8") if args.path.exists() else ""
        if current != page:
            print(f"{args.path} is not current: python -m tokentrail.cli.settings_doc")
            return 1
        return 0
    args.path.write_text(page, "utf-8")
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
