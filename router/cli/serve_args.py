"""The flags of `baton serve`, generated from the knobs of router/cli/config/: one argparse
group per config group, each flag with the knob's default, help text and parser. The CLI,
the deploy configs' tests and docs/configuration.md all read the same definitions."""

from __future__ import annotations

import argparse
from typing import Any

from router.cli.config.knob import Setting, settings
from router.cli.config.serve import ConfigError, ServeConfig, group_types
from router.cluster.autoscale.policy import AutoscaleConfig
from router.frontdoor.limits import DoorLimits


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    for group in group_types().values():
        section = p.add_argument_group(group.TITLE, group.ABOUT)
        for setting in settings(group):
            action = section.add_argument(setting.flag, **_argparse_options(setting))
            # Set after: on a --X/--no-X flag argparse would append its own default.
            action.help = help_text(setting).replace("%", "%%")


def help_text(setting: Setting) -> str:
    """The knob's help and its default, as --help prints it."""
    return f"{setting.description()} (default: {setting.shown_default()})"


def _argparse_options(setting: Setting) -> dict[str, Any]:
    how = setting.knob
    if setting.is_switch():
        return {"action": "store_true"}
    if setting.is_toggle():
        return {"action": argparse.BooleanOptionalAction, "default": setting.default}
    options: dict[str, Any] = {"default": setting.default}
    parse = how.parse or (None if setting.kind is str else setting.kind)
    if parse is not None:
        options["type"] = parse
    if how.choices is not None:
        options["choices"] = list(how.choices)
    if how.metavar is not None:
        options["metavar"] = how.metavar
    return options


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """The checked configuration of a parsed `baton serve`; a command line it refuses exits
    with a message that names the flag."""
    try:
        return ServeConfig.from_args(args)
    except ConfigError as e:
        raise SystemExit(f"baton serve: {e}") from None


def door_limits(args: argparse.Namespace) -> DoorLimits:
    return serve_config(args).limits.door_limits()


def autoscale_config(args: argparse.Namespace) -> AutoscaleConfig | None:
    return serve_config(args).autoscale.autoscale_config()
