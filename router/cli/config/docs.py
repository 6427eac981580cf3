"""Write docs/configuration.md from the knobs and the environment registry:

    python -m router.cli.config.docs > docs/configuration.md

tests/cli/test_configuration_doc.py fails when the checked-in page and this output differ.
"""

from __future__ import annotations

import sys

from core import env
from router.cli.config.knob import Setting, settings
from router.cli.config.serve import group_types

COMMAND = "python -m router.cli.config.docs > docs/configuration.md"

_HEADER = f"""# Configuration

Every setting of `baton serve`: its flag, its default and what it does, grouped as
`baton serve --help` prints them, then the `BATON_*` environment variables. Each knob is one
typed field with one default (router/cli/config/); where a library record holds the same
setting (core/config.py's EngineConfig, router/cluster/spec.py's ClusterSpec, the router's
RouterConfig, the front door's DoorLimits, the autoscaler's AutoscaleConfig), the knob reads
its default from there, so the CLI and the library agree.

This page is generated: edit the knobs or core/env.py, then run `{COMMAND}`.
"""


def flag_cell(setting: Setting) -> str:
    """The flag as `--help` spells it: --X / --no-X, a bare --X, or --X VALUE."""
    how = setting.knob
    if setting.is_toggle():
        return f"`{setting.flag}` / `{setting.negated()}`"
    if setting.is_switch():
        return f"`{setting.flag}`"
    if how.metavar is not None:
        value = how.metavar
    elif how.choices is not None:
        value = "{" + ",".join(how.choices) + "}"
    else:
        value = setting.name.upper()
    return f"`{setting.flag} {value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    lines = [_HEADER]
    for group in group_types().values():
        lines += [f"## {group.TITLE}", "", f"{group.ABOUT[0].upper()}{group.ABOUT[1:]}.", ""]
        lines += ["| flag | default | what it does |", "| --- | --- | --- |"]
        for setting in settings(group):
            cells = (flag_cell(setting), setting.shown_default(), setting.description())
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    lines += [
        "## Environment variables",
        "",
        "Read when asked for, in the process that needs them (core/env.py); a switch that",
        "changes numbers must agree on every node of a cluster. An on/off switch is on unless",
        "set to `0`.",
        "",
        "| variable | default | why |",
        "| --- | --- | --- |",
    ]
    for switch in env.SWITCHES:
        cells = (f"`{switch.name}`", switch.default_doc, switch.why)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
