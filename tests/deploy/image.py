"""deploy/Dockerfile as BuildKit reads it: its instructions (through `dockerfile`, a binding
to BuildKit's own Dockerfile parser), the files each COPY reads from the build context,
and the repository files a build of a checkout can send."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

dockerfile = pytest.importorskip("dockerfile", reason="needs dockerfile (BuildKit's parser)")

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
# BuildKit reads <Dockerfile>.dockerignore beside the Dockerfile before a root .dockerignore.
IGNORE_FILE = DOCKERFILE.with_name(DOCKERFILE.name + ".dockerignore")
_WILDCARDS = set("*?[$")


def commands(path: Path = DOCKERFILE) -> tuple[dockerfile.Command, ...]:
    return dockerfile.parse_file(str(path))


def copy_sources(path: Path = DOCKERFILE) -> list[str]:
    """The build-context paths every COPY / ADD reads, in order (not `--from` a stage)."""
    sources = []
    for command in commands(path):
        if command.cmd not in ("COPY", "ADD"):
            continue
        if any(flag.startswith("--from=") for flag in command.flags):
            continue
        for source in command.value[:-1]:
            # Globs and build args would need expanding first; none are used today.
            assert not _WILDCARDS & set(source), f"line {command.start_line}: {source!r}"
            sources.append(source)
    return sources


def tracked_files() -> list[str]:
    """The repository's files (git's index): what a clean checkout holds."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"needs a git checkout: {exc}")
    return [p for p in out.decode().split("\0") if p and (REPO / p).exists()]
