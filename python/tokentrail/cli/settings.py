"""How `tokentrail serve`'s settings are read and resolved, whatever dataclasses hold them.

A command's settings are the fields of one dataclass, and of the dataclasses it nests with
`section(...)`, that carry a `Setting` (`tokentrail.setting`): the group, the help line, the
unit. From them come the grouped flags, the `--config FILE.toml` keys (the flag without its
dashes), the `TOKENTRAIL_*` variables, and `--print-config`; the default is the field's own.
The command line wins, then the environment, then the file, then the default.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from tokentrail.compat import tomllib
from tokentrail.errors import SettingError
from tokentrail.kinds import SettingGroup, SettingSource
from tokentrail.setting import SECTION, SETTING, Setting

ENV_PREFIX = "TOKENTRAIL_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

S = TypeVar("S")


@dataclass(frozen=True)
class Field:
    """One setting of a command, as the parser, the file and the environment see it."""

    # The setting's name (its flag, key and variable): the field's, or the `Setting`'s own.
    name: str
    # Where the value goes: the field names from the command's dataclass down, through its
    # sections ("config", "limits", "body_timeout_s").
    path: tuple[str, ...]
    kind: type
    optional: bool
    listed: bool
    default: Any
    info: Setting
    # A repeatable setting held as a tuple (a list by default).
    as_tuple: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.key

    @property
    def key(self) -> str:
        return self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def choices(self) -> list[str] | None:
        if self.info.choices is not None:
            return self.info.choices()
        if issubclass(self.kind, Enum):
            return [str(member.value) for member in self.kind]
        return None

    def metavar(self, choices: list[str] | None) -> str | None:
        if self.info.metavar is not None:
            return self.info.metavar
        if choices is not None:
            return "{" + ",".join(choices) + "}"
        if self.kind in (int, float):
            return {"s": "SECONDS", "": "N"}.get(self.info.unit, self.info.unit.upper())
        return None

    def default_shown(self) -> str:
        """The default as `--help` and the settings reference show it, without its unit."""
        if self.info.default_text is not None:
            return self.info.default_text
        if self.default is None:
            return "none"
        if self.kind is bool:
            return "on" if self.default else "off"
        if self.listed:
            return "none" if not self.default else ", ".join(map(str, self.default))
        return _plain(self.default)

    def has_unit(self) -> bool:
        """Whether the shown default is a value the unit applies to (not a text or none)."""
        return (
            bool(self.info.unit)
            and self.info.default_text is None
            and not (self.default is None or self.kind is bool or self.listed)
        )

    def help_line(self) -> str:
        shown = self.default_shown() + (f" {self.info.unit}" if self.has_unit() else "")
        return f"{self.info.help} (default: {shown}; {self.env})"

    def from_flag(self, raw: str) -> Any:
        """One command-line value (a list setting's flag gives one item each time)."""
        try:
            return self.parse(raw, self.flag) if self.listed else self._scalar(raw, self.flag)
        except SettingError as exc:
            # argparse names the flag itself: "argument --port: 'x' is not an integer".
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{self.flag}: ")) from None

    def parse(self, raw: str, where: str) -> Any:
        """A value from the command line or the environment, as this field's type."""
        if self.listed:
            if raw.startswith("["):
                try:
                    items = json.loads(raw)
                except json.JSONDecodeError:
                    raise SettingError(f"{where}: {raw!r} is not a JSON list of strings") from None
                return self.check(items, where)
            return [self._scalar(raw, where)]
        # Unset, unless "none" is one of the setting's values (`--tool-parser none`).
        if self.optional and raw.lower() in ("", "none") and "none" not in (self.choices() or ()):
            return None
        return self._scalar(raw, where)

    def _scalar(self, raw: str, where: str) -> Any:
        if self.kind is bool:
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            raise SettingError(f"{where}: {raw!r} is not one of {', '.join(_TRUE + _FALSE)}")
        if self.kind in (int, float):
            try:
                number = self.kind(raw)
            except ValueError:
                what = "an integer" if self.kind is int else "a number"
                raise SettingError(f"{where}: {raw!r} is not {what}") from None
            return self._in_range(number, where)
        return self._check_one(raw, where)

    @property
    def bounds(self) -> tuple[float | None, float | None]:
        return self.info.bounds or (0, None)

    def range_text(self) -> str:
        lo, hi = self.bounds
        unit = f" {self.info.unit}" if self.info.unit else ""
        if hi is None:
            return f"{_plain(lo)}{unit} or more" if lo is not None else "any number"
        if lo is None:
            return f"at most {_plain(hi)}{unit}"
        return f"{_plain(lo)} to {_plain(hi)}{unit}"

    def _in_range(self, value: float, where: str) -> Any:
        """A number within the setting's range (and finite), else `SettingError` naming the
        setting, the value and the range."""
        lo, hi = self.bounds
        if (
            not math.isfinite(value)
            or (lo is not None and value < lo)
            or (hi is not None and value > hi)
        ):
            raise SettingError(
                f"{where}: {_plain(value)} is out of range; allowed: {self.range_text()}"
            )
        return value

    def check(self, value: Any, where: str) -> Any:
        """A value as a TOML file (or a parsed string) gives it, checked against the type."""
        if self.listed:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise SettingError(f"{where}: {value!r} is not a list of strings")
            return list(value)
        return self._check_one(value, where)

    def _check_one(self, value: Any, where: str) -> Any:
        if value is None and self.optional:
            return None
        wanted: tuple[type, ...] = (int, float) if self.kind is float else (self.kind,)
        if issubclass(self.kind, Enum) or self.info.choices is not None:
            wanted = (str,)
        if not isinstance(value, wanted) or (isinstance(value, bool) and self.kind is not bool):
            raise SettingError(f"{where}: {value!r} is not {_type_name(self.kind)}")
        choices = self.choices()
        if choices is not None and str(value) not in choices:
            raise SettingError(f"{where}: {value!r} is not one of {', '.join(choices)}")
        if issubclass(self.kind, Enum):
            return self.kind(value)
        if self.kind in (int, float):
            self._in_range(typing.cast(float, value), where)
        return float(typing.cast(float, value)) if self.kind is float else value


def fields_of(cls: type, path: tuple[str, ...] = ()) -> list[Field]:
    """The settings of a settings dataclass and of its sections, in declaration order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if SECTION in f.metadata:
            out += fields_of(f.metadata[SECTION], (*path, f.name))
            continue
        info = f.metadata.get(SETTING)
        if not isinstance(info, Setting):
            continue
        kind, optional, container = _unwrap(hints[f.name])
        default: Any = (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        )
        name = info.name or f.name
        listed, as_tuple = container is not None, container is tuple
        if listed:
            default = list(default)
        out.append(Field(name, (*path, f.name), kind, optional, listed, default, info, as_tuple))
    return out


def add_arguments(
    parser: argparse.ArgumentParser, cls: type, only: Iterable[str] | None = None
) -> None:
    """`--config`, `--print-config` and one flag per setting (or per setting named in `only`),
    in its group, each defaulting to absent so that `resolve` can tell a flag given from one
    left out."""
    parser.add_argument(
        "--config",
        metavar="FILE.toml",
        default=None,
        help="read settings from a TOML file: keys are the flags without their dashes "
        "(max-body-bytes = 1048576); flags and TOKENTRAIL_* variables win over it",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved settings as a TOML file, each with where it came from, and exit",
    )
    wanted = None if only is None else set(only)
    chosen = [f for f in fields_of(cls) if wanted is None or f.name in wanted]
    groups = {
        g: parser.add_argument_group(g.value)
        for g in SettingGroup
        if any(f.info.group is g for f in chosen)
    }
    for f in chosen:
        group = groups[f.info.group]
        common: dict[str, Any] = {"default": argparse.SUPPRESS, "help": f.help_line()}
        if f.kind is bool:
            group.add_argument(f.flag, action=argparse.BooleanOptionalAction, **common)
            continue
        if f.info.const is not None:
            common.update(nargs="?", const=f.info.const)
        choices = f.choices()
        group.add_argument(
            f.flag,
            type=f.from_flag,
            action="append" if f.listed else "store",
            metavar=f.metavar(choices),
            **common,
        )


@dataclass
class Resolved:
    """Settings and where each came from."""

    fields: list[Field]
    values: dict[str, Any]
    sources: dict[str, SettingSource]
    config_file: Path | None = None

    def build(self, cls: type[S]) -> S:
        """`cls` (the dataclass the fields were read from) and its sections, holding the
        resolved values."""
        by_path = {f.path: self._stored(f) for f in self.fields}
        return typing.cast(S, _build(cls, (), by_path))

    def _stored(self, f: Field) -> Any:
        value = self.values[f.name]
        return tuple(value) if f.as_tuple and value is not None else value


def _build(cls: type, path: tuple[str, ...], by_path: Mapping[tuple[str, ...], Any]) -> Any:
    kwargs = {}
    for f in dataclasses.fields(cls):
        where = (*path, f.name)
        if SECTION in f.metadata:
            kwargs[f.name] = _build(f.metadata[SECTION], where, by_path)
        elif where in by_path:
            kwargs[f.name] = by_path[where]
    return cls(**kwargs)


def resolve(
    cls: type,
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
) -> Resolved:
    """Each setting from the command line, else `TOKENTRAIL_<NAME>`, else the `--config` file,
    else its default. Raises `SettingError` for a file that cannot be read, an unknown key or
    a value of the wrong type, naming the file, key or variable and the value."""
    environ = os.environ if environ is None else environ
    path = Path(args.config) if args.config else None
    from_file = read_config(path, cls) if path is not None else {}
    values: dict[str, Any] = {}
    sources: dict[str, SettingSource] = {}
    fields = fields_of(cls)
    for f in fields:
        if f.name in vars(args):
            values[f.name], sources[f.name] = _flag_value(f, vars(args)[f.name])
        elif f.env in environ:
            values[f.name] = f.parse(environ[f.env], f.env)
            sources[f.name] = SettingSource.ENVIRONMENT
        elif f.key in from_file:
            values[f.name], sources[f.name] = from_file[f.key], SettingSource.CONFIG_FILE
        else:
            values[f.name], sources[f.name] = f.default, SettingSource.DEFAULT
    return Resolved(fields, values, sources, path)


def _flag_value(f: Field, value: Any) -> tuple[Any, SettingSource]:
    if f.listed:
        # Each `--flag VALUE` appended a one-item (or JSON) list.
        value = [item for chunk in value for item in chunk]
    return value, SettingSource.COMMAND_LINE


def read_config(path: Path, cls: type) -> dict[str, Any]:
    """A TOML file's settings by key, each checked; a key in a [table] counts as top-level, so
    a file may group its settings as `--help` does."""
    try:
        raw = tomllib.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise SettingError(f"--config {path}: cannot read it ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingError(f"--config {path}: not a TOML file: {exc}") from None
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        items = value.items() if isinstance(value, dict) else [(key, value)]
        for k, v in items:
            flat[k.replace("_", "-")] = v
    known = {f.key: f for f in fields_of(cls)}
    unknown = sorted(set(flat) - set(known))
    if unknown:
        raise SettingError(
            f"--config {path}: unknown setting{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)} (the flags of `tokentrail serve --help`, without dashes)"
        )
    return {k: known[k].check(v, f"--config {path}: {k}") for k, v in flat.items()}


def to_toml(resolved: Resolved) -> str:
    """The resolved settings as a TOML file `--config` reads back, grouped as `--help` shows
    them, each with where it came from; an unset one is a comment, a secret one is not shown."""
    lines = [
        "# tokentrail serve settings: flags win over TOKENTRAIL_* variables, which win over",
        "# this file" + (f" (read from {resolved.config_file})" if resolved.config_file else ""),
    ]
    by_group: dict[SettingGroup, list[Field]] = {}
    for f in resolved.fields:
        by_group.setdefault(f.info.group, []).append(f)
    for group in SettingGroup:
        if group not in by_group:
            continue
        lines += ["", f"# -- {group.value}"]
        for f in by_group[group]:
            value, source = resolved.values[f.name], resolved.sources[f.name]
            where = source.value + (f" {f.env}" if source is SettingSource.ENVIRONMENT else "")
            if f.info.secret and value is not None:
                lines.append(f"# {f.key}: set ({where}), not printed")
            elif value is None:
                lines.append(f"# {f.key} =  # unset ({where})")
            else:
                lines.append(f"{f.key} = {_toml_value(value)}  # {where}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return json.dumps(str(value.value))
    if isinstance(value, str):
        # A JSON string is a TOML basic string (the same escapes).
        return json.dumps(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def _plain(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _type_name(kind: type) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    return names.get(kind, "a string")


def _unwrap(hint: Any) -> tuple[type, bool, type | None]:
    """A field's annotation as (the value's type, may be None, the list or tuple holding it)."""
    optional = False
    args: Iterable[Any]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        (hint,) = args
    container = typing.get_origin(hint)
    if container is list:
        (item,) = typing.get_args(hint)
        return item, optional, list
    if container is tuple:
        item, _ = typing.get_args(hint)  # tuple[X, ...]
        return item, optional, tuple
    return hint, optional, None
