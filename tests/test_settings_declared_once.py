"""Each `tokentrail serve` setting is declared once, on the dataclass field that holds its value:
its flag, variable, `--config` key, help and default all come from that field, so no default
is stated in two places, and every field of those dataclasses is a setting, a nested section or
marked internal."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from pathlib import Path
from typing import Any

from tokentrail import cli
from tokentrail.adapter.config import AdapterConfig
from tokentrail.adapter.request.limits import Limits
from tokentrail.cli import settings
from tokentrail.cli.serve import ServeSettings, resolve_settings
from tokentrail.kinds import SettingGroup, SettingSource
from tokentrail.setting import SECTION, internal, kind_of, section, setting
from tokentrail.text.vision import ImageLimits
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.policies import ManagerPolicies

FIELDS = settings.fields_of(ServeSettings)


def settings_classes(cls: type = ServeSettings) -> list[type]:
    """`cls` and every dataclass it nests as a section, depth first."""
    out = [cls]
    for f in dataclasses.fields(cls):
        if SECTION in f.metadata:
            out += settings_classes(f.metadata[SECTION])
    return out


def at(obj: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        obj = getattr(obj, name)
    return obj


def test_every_field_is_a_setting_a_section_or_internal() -> None:
    classes = settings_classes()
    assert set(classes) == {ServeSettings, AdapterConfig, Limits, ImageLimits, ManagerPolicies}
    undeclared = [
        f"{cls.__name__}.{f.name}"
        for cls in classes
        for f in dataclasses.fields(cls)
        if kind_of(f) is None
    ]
    assert undeclared == []


def test_each_setting_has_one_name_and_its_default_is_its_fields() -> None:
    names = [f.name for f in FIELDS]
    assert len(names) == len(set(names)), "two settings share a flag"
    # A serve-only setting never restates a setting of the nested dataclasses, by its name or
    # its field's (an internal field, such as the adapter's `AccessLog`, may be built from
    # serve-only ones).
    nested = {name for f in FIELDS if len(f.path) > 1 for name in (f.name, f.path[-1])}
    own = {f.name for f in FIELDS if len(f.path) == 1}
    assert own & nested == set()
    # The flag's default is the field's own default (by construction, read from the field).
    defaults = ServeSettings()
    for f in FIELDS:
        value = at(defaults, f.path)
        assert (list(value) if f.listed else value) == f.default, f.name
    # Nothing given, the command resolves to the library's own defaults.
    resolved = resolve_settings(cli.build_parser().parse_args(["serve"]), environ={})
    assert resolved == defaults
    assert resolved.config == AdapterConfig() and resolved.config.limits == Limits()
    assert resolved.config.image_limits == ImageLimits()
    assert resolved.manager == ManagerPolicies()


def test_the_managers_keyword_defaults_are_its_policies() -> None:
    keywords = inspect.signature(TrajectoryManager).parameters
    for f in dataclasses.fields(ManagerPolicies):
        assert keywords[f.name].default == getattr(ManagerPolicies(), f.name), f.name


@dataclasses.dataclass
class Inner:
    size_bytes: int = setting(5, SettingGroup.LIMITS, "how big", unit="bytes", name="inner_size")
    patterns: tuple[str, ...] = setting((), SettingGroup.SESSIONS, "which", metavar="RE")
    hidden: int = internal(7)


@dataclasses.dataclass
class Outer:
    port: int = setting(1, SettingGroup.SERVER, "where")
    inner: Inner = section(Inner)


def test_a_nested_setting_takes_its_name_and_default_from_its_field_and_lands_on_it(
    tmp_path: Path,
) -> None:
    """The machinery on its own dataclasses: a setting in a section is named by its `name=`,
    its help shows the field's default, and each source lands on the nested field."""

    parser = argparse.ArgumentParser()
    settings.add_arguments(parser, Outer)
    text = " ".join(parser.format_help().split())
    assert "--inner-size BYTES how big (default: 5 bytes; TOKENTRAIL_INNER_SIZE)" in text
    assert "--size-bytes" not in text and "--hidden" not in text

    config = tmp_path / "c.toml"
    config.write_text("[limits]\ninner-size = 9\n")
    args = parser.parse_args(["--config", str(config), "--patterns", "a", "--patterns", "b"])
    r = settings.resolve(Outer, args, {"TOKENTRAIL_PORT": "3"})
    built = r.build(Outer)
    assert built == Outer(3, Inner(9, ("a", "b"), 7))
    assert [r.sources[n] for n in ("port", "inner_size", "patterns")] == [
        SettingSource.ENVIRONMENT,
        SettingSource.CONFIG_FILE,
        SettingSource.COMMAND_LINE,
    ]
    assert settings.resolve(Outer, parser.parse_args([]), {}).build(Outer) == Outer()


def test_none_is_a_parsers_value_from_a_variable_too() -> None:
    """`--tool-parser none` is off; so is `TOKENTRAIL_TOOL_PARSER=none`, which `--print-config`
    prints back as the value it was given (a file reading it gets the same)."""
    args = cli.build_parser().parse_args(["serve"])
    r = settings.resolve(ServeSettings, args, {"TOKENTRAIL_TOOL_PARSER": "none"})
    assert r.build(ServeSettings).config.tool_parser is None
    assert 'tool-parser = "none"  # environment TOKENTRAIL_TOOL_PARSER' in settings.to_toml(r)
