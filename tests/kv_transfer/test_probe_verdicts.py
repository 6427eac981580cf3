"""Whether a transport backend imports is probed once a machine (kv_transfer.registry): a
verdict is kept while its package stays as installed, a package installed again is probed
again, a broken one is refused with its error, and one not installed needs no probe."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kv_transfer import registry


@pytest.fixture
def probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """The child processes probes start; a package dir on both this and the children's path,
    and the verdicts kept under tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "pkgs").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "pkgs"))
    started: list[list[str]] = []
    real_run = subprocess.run

    def run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        started.append(args)
        return real_run(args, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(registry.subprocess, "run", run)
    registry.unavailable_reason.cache_clear()
    yield started
    registry.unavailable_reason.cache_clear()


def backend(tmp_path: Path, name: str, body: str) -> Path:
    """A package `name` whose `_api` module runs `body` when imported, registered as a
    backend (dropped again when the test ends)."""
    package = tmp_path / "pkgs" / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_api.py").write_text(body)
    importlib.invalidate_caches()
    registry.register_backend(name, "kv_transfer.local_driver:LocalDriver", f"{name}._api")
    return package


@pytest.fixture(autouse=True)
def forget_backends() -> Iterator[None]:
    known = dict(registry._BACKENDS)
    yield
    registry._BACKENDS.clear()
    registry._BACKENDS.update(known)


def test_a_verdict_is_kept_until_the_package_is_installed_again(
    probes: list[list[str]], tmp_path: Path
) -> None:
    package = backend(tmp_path, "probe_ok", "VALUE = 1\n")
    assert registry.unavailable_reason("probe_ok") is None
    assert len(probes) == 1
    assert "probe_ok._api" not in sys.modules  # the probe ran in a child

    registry.unavailable_reason.cache_clear()  # as a new worker process would start
    assert registry.unavailable_reason("probe_ok") is None
    assert len(probes) == 1

    init = package / "__init__.py"
    init.write_text("# installed again\n")
    os.utime(init, ns=(0, 1_000_000_000))
    registry.unavailable_reason.cache_clear()
    assert registry.unavailable_reason("probe_ok") is None
    assert len(probes) == 2


def test_a_broken_package_is_refused_with_its_error(
    probes: list[list[str]], tmp_path: Path
) -> None:
    backend(tmp_path, "probe_broken", "raise OSError('libucs.so: cannot open shared object')\n")
    reason = registry.unavailable_reason("probe_broken")
    assert reason is not None
    assert reason.startswith("probe_broken._api does not import")
    assert "libucs.so" in reason
    registry.unavailable_reason.cache_clear()
    assert registry.unavailable_reason("probe_broken") == reason
    assert len(probes) == 1


def test_a_package_not_installed_needs_no_probe(probes: list[list[str]]) -> None:
    registry.register_backend("probe_absent", "x:Y", "probe_absent_pkg._api")
    assert registry.unavailable_reason("probe_absent") == "probe_absent_pkg is not installed"
    assert probes == []


def test_an_unwritable_cache_still_answers(
    probes: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # a file, not a folder
    backend(tmp_path, "probe_nocache", "")
    assert registry.unavailable_reason("probe_nocache") is None
    registry.unavailable_reason.cache_clear()
    assert registry.unavailable_reason("probe_nocache") is None
    assert len(probes) == 2
