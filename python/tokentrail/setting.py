"""What a settings field says about itself, declared on the dataclass that holds the value.

A field made with `setting(default, group, help, ...)` is a `tokentrail serve` setting: its flag,
`--config` key and `TOKENTRAIL_*` variable are its name (or `name=` where the flag reads better
than the attribute), its default is the field's own. `section(Cls)` nests a settings dataclass
(its settings are the command's too); `internal(default)` marks a field no flag sets.
`tokentrail.cli.settings` turns these into the parser, the file and the variables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokentrail.kinds import SettingGroup

# Upper ends of the settings' ranges: threads a process can usefully run, and a time no
# setting needs to exceed (115 days; a larger one is a typo or an overflow waiting).
MAX_WORKERS = 256
MAX_SECONDS = 10_000_000

# The keys of a dataclass field's metadata this module writes.
SETTING, SECTION, INTERNAL = "setting", "settings_section", "internal"


@dataclass(frozen=True)
class Setting:
    """What a settings field says about itself: its group and one line of help."""

    group: SettingGroup
    help: str
    # Appended to the default in the help ("bytes", "s"); empty for a count or a name.
    unit: str = ""
    # The allowed values, when not an enum's (computed when the parser is built).
    choices: Callable[[], list[str]] | None = None
    metavar: str | None = None
    # How the default reads in the help when its value says too little ("off", "the model's").
    default_text: str | None = None
    # Never printed (`--print-config` says only that it is set).
    secret: bool = False
    # The value a flag given without one takes (its value is then optional).
    const: Any = None
    # A number's allowed range, both ends included (None: open); a number setting without
    # one takes 0 and up. A float must also be finite.
    bounds: tuple[float | None, float | None] | None = None
    # The setting's name (flag, key, variable) where it differs from the field's.
    name: str | None = None


def setting(
    default: Any,
    group: SettingGroup,
    help: str,
    *,
    unit: str = "",
    choices: Callable[[], list[str]] | None = None,
    metavar: str | None = None,
    default_text: str | None = None,
    secret: bool = False,
    const: Any = None,
    bounds: tuple[float | None, float | None] | None = None,
    name: str | None = None,
) -> Any:
    """A settings field: `default` (a list default is copied per instance) and its `Setting`."""
    info = Setting(group, help, unit, choices, metavar, default_text, secret, const, bounds, name)
    meta = {SETTING: info}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def section(cls: type) -> Any:
    """A field holding a settings dataclass (a fresh default each), whose settings count too."""
    return dataclasses.field(default_factory=cls, metadata={SECTION: cls})


def internal(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING) -> Any:
    """A field of a settings dataclass that no flag sets: the code (or a library caller) does."""
    return dataclasses.field(default=default, default_factory=factory, metadata={INTERNAL: True})


def kind_of(f: dataclasses.Field[Any]) -> str | None:
    """What a dataclass field is to the settings: SETTING, SECTION, INTERNAL or None
    (undeclared)."""
    return next((key for key in (SETTING, SECTION, INTERNAL) if key in f.metadata), None)
