"""core/env.py: how a switch reads its variable."""

from __future__ import annotations

import pytest

from core import env


def test_a_flag_is_on_unless_set_to_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    flag = env.EnvFlag("BATON_TEST_FLAG", "a test")
    monkeypatch.delenv(flag.name, raising=False)
    assert flag.get() is True
    for value, on in (("0", False), ("1", True), ("", True), ("yes", True)):
        monkeypatch.setenv(flag.name, value)
        assert flag.get() is on, value


def test_a_text_is_none_unset_or_empty_and_read_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    text = env.EnvText("BATON_TEST_TEXT", "a test")
    monkeypatch.delenv(text.name, raising=False)
    assert text.get() is None
    monkeypatch.setenv(text.name, "")
    assert text.get() is None
    monkeypatch.setenv(text.name, "10.0.0.7")
    assert text.get() == "10.0.0.7"


def test_every_switch_says_why() -> None:
    for switch in env.SWITCHES:
        assert switch.why and switch.default_doc, switch.name
