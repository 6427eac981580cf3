"""One knob of `baton serve`: a dataclass field that carries its default, its help text and
how its flag is spelled, so the parser (parser.py), the checks (serve.py) and
docs/configuration.md (docs.py) all read the one definition.

A group of knobs is a frozen dataclass with a `TITLE` and an `ABOUT` (its `--help` section);
each field is made by `knob(default, help, ...)`. Where a library record (EngineConfig,
RouterConfig, DoorLimits, AutoscaleConfig, ClusterSpec) holds the same setting, the knob's
default is read from it with `default_of`, so the CLI and the library cannot disagree.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import Any

from core.env import EnvText

_KNOB = "baton.knob"


@dataclass(frozen=True)
class Knob:
    """How one field is asked for and explained."""

    help: str
    """What it does and why one would change it: one or two sentences, no default (that is
    printed from the value, or from `default_doc`)."""
    default_doc: str | None = None
    """The default in words, where the value alone does not say it (None: what None means)."""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None
    """Turns the flag's text into the value (default: the field's type)."""
    minimum: float | None = None
    """Smallest value accepted (checked with the other knobs, serve.py)."""
    policy: str | None = None
    """The prefill routing policy this knob belongs to: set with another, it is an error."""
    policy_arg: str | None = None
    """The keyword argument the policy takes this knob's value as."""
    env: EnvText | None = None
    """The environment variable (core/env.py) that gives the value when the flag does not."""


def knob(default: Any, help: str, **how: Any) -> Any:
    """A dataclass field with its default and its `Knob`."""
    return dataclasses.field(default=default, metadata={_KNOB: Knob(help=help, **how)})


def default_of(record: type, name: str) -> Any:
    """The default a library record's field `name` has (its default factory's value)."""
    for f in dataclasses.fields(record):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    raise LookupError(f"{record.__name__} has no field {name!r} with a default")


@dataclass(frozen=True)
class Setting:
    """One knob of a group, resolved: the field's name (the argparse dest), its flag, its
    value type (None stripped), its default and its `Knob`."""

    name: str
    flag: str
    kind: type
    optional: bool
    default: Any
    knob: Knob

    def negated(self) -> str:
        """The flag that turns an on/off knob off."""
        return "--no-" + self.flag.removeprefix("--")

    def spelled(self, value: Any) -> str:
        """The flag as a user gave it for `value` (--no-X for an on/off knob set off)."""
        return self.negated() if self.kind is bool and value is False else self.flag

    def is_switch(self) -> bool:
        """A bare flag that turns the knob on (its default is off)."""
        return self.kind is bool and self.default is False

    def is_toggle(self) -> bool:
        """--X / --no-X: an on/off knob that is on, or decided elsewhere, by default."""
        return self.kind is bool and not self.is_switch()

    def description(self) -> str:
        """What the knob does, with the routing policy it belongs to."""
        if self.knob.policy is None:
            return self.knob.help
        return f"with --policy {self.knob.policy}: {self.knob.help}"

    def shown_default(self) -> str:
        """The default as --help and docs/configuration.md print it (an environment
        variable first, where one gives the value)."""
        shown = self.knob.default_doc
        if shown is None:
            shown = _in_words(self.default)
        env = self.knob.env
        return shown if env is None else f"${env.name}, else {shown}"


def _in_words(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def settings(group: type) -> list[Setting]:
    """The knobs of a group record, in field order."""
    hints = typing.get_type_hints(group)
    found = []
    for f in dataclasses.fields(group):
        how = f.metadata.get(_KNOB)
        if how is None:
            raise TypeError(f"{group.__name__}.{f.name} is not a knob (make it with knob())")
        kind, optional = _value_type(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        found.append(Setting(f.name, flag, kind, optional, f.default, how))
    return found


def _value_type(hint: Any) -> tuple[type, bool]:
    """(the type a value has, whether None is allowed) of `int`, `float | None`, ..."""
    if isinstance(hint, UnionType) or typing.get_origin(hint) is typing.Union:
        members = [m for m in typing.get_args(hint) if m is not NoneType]
        if len(members) != 1:
            raise TypeError(f"a knob holds one type (or None), not {hint}")
        return members[0], True
    return hint, False
