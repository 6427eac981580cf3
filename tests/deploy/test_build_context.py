"""The image's build context is what deploy/Dockerfile.dockerignore leaves of the repository
(computed as BuildKit does, tests/deploy/dockerignore.py), and it holds exactly what the
Dockerfile copies: every COPY source with all its files, and nothing no COPY reads.

Built from the repository root (`docker build -f deploy/Dockerfile .`), so the context's
root is the repository's; the docs' build commands are checked to say so."""

from __future__ import annotations

import posixpath
import re
import shlex

import pytest

from tests.deploy.dockerignore import build_context, read_patterns
from tests.deploy.image import IGNORE_FILE, REPO, copy_sources, tracked_files

# Files whose `docker build` lines operators copy.
BUILD_DOCS = ("docs/deploy.md", "deploy/Dockerfile")


def _under(source: str, files: list[str]) -> list[str]:
    source = posixpath.normpath(source)
    if source == ".":
        return list(files)
    return [f for f in files if f == source or f.startswith(source + "/")]


def context_problems(patterns: list[str], sources: list[str], files: list[str]) -> list[str]:
    """Why a build with this ignore file would fail or copy less than the repository has."""
    context = build_context(patterns, files)
    problems = []
    for source in sources:
        wanted = _under(source, files)
        if not wanted:
            problems.append(f"COPY {source}: no such file in the repository")
        left_out = sorted(set(wanted) - context)
        if left_out:
            problems.append(f"COPY {source}: the ignore file leaves out {left_out[:3]}...")
    return problems


def test_every_copy_source_is_in_the_build_context() -> None:
    patterns = read_patterns(IGNORE_FILE.read_text())
    assert context_problems(patterns, copy_sources(), tracked_files()) == []


def test_context_holds_only_what_the_image_copies() -> None:
    files = tracked_files()
    context = build_context(read_patterns(IGNORE_FILE.read_text()), files)
    copied = {f for source in copy_sources() for f in _under(source, files)}
    assert context, "the ignore file leaves nothing to build from"
    assert sorted(context - copied) == [], "sent to the builder but copied by no COPY"


@pytest.mark.parametrize(
    "dropped", [p for p in read_patterns(IGNORE_FILE.read_text()) if p.startswith("!")]
)
def test_dropping_any_exception_is_caught(dropped: str) -> None:
    """The check above can fail: without any one of its `!` lines, a COPY loses files."""
    patterns = [p for p in read_patterns(IGNORE_FILE.read_text()) if p != dropped]
    problems = context_problems(patterns, copy_sources(), tracked_files())
    assert any(dropped[1:].rstrip("/") in problem for problem in problems), problems


def test_a_copy_of_a_missing_path_is_caught() -> None:
    files = ["core/a.py"]
    assert context_problems(["**", "!core/"], ["core", "nowhere"], files) == [
        "COPY nowhere: no such file in the repository"
    ]


def _docker_builds(text: str) -> list[list[str]]:
    commands = []
    for line in re.findall(r"^\s*(?:#\s*)?(docker build .*)$", text, flags=re.MULTILINE):
        commands.append(shlex.split(line))
    return commands


@pytest.mark.parametrize("doc", BUILD_DOCS)
def test_documented_builds_use_the_repository_root_as_context(doc: str) -> None:
    """The ignore file sits beside the Dockerfile and is only read for `-f deploy/Dockerfile`;
    its patterns are relative to the context, which must be the repository root."""
    builds = _docker_builds((REPO / doc).read_text())
    assert builds, f"{doc} shows no `docker build`"
    for argv in builds:
        assert argv[argv.index("-f") + 1] == "deploy/Dockerfile", argv
        assert argv[-1] == ".", f"context must be the repository root (run from it): {argv}"
