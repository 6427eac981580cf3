"""docs/configuration.md is the generator's output, byte for byte, and names every flag and
every BATON_* variable."""

from __future__ import annotations

from pathlib import Path

from core import env
from router.cli.config.docs import COMMAND, render
from router.cli.config.serve import ServeConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_checked_in_page_is_the_generated_one() -> None:
    assert DOC.read_text() == render(), f"docs/configuration.md is stale: run `{COMMAND}`"


def test_the_page_names_every_flag_and_variable() -> None:
    text = render()
    for setting, _ in ServeConfig().knobs():
        assert f"`{setting.flag}" in text, setting.flag
    for switch in env.SWITCHES:
        assert f"`{switch.name}`" in text, switch.name
