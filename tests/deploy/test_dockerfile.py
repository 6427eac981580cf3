"""deploy/Dockerfile cannot be built here (no Docker engine), so check what can be checked
statically: it copies every package Baton ships, installs the extras a GPU node needs,
and its default command is one the CLI accepts."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from tests.deploy.serve_command import parse_serve

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_base_image_is_cuda() -> None:
    args = dict(
        rest.split("=", 1) for word, rest in _instructions() if word == "ARG" and "=" in rest
    )
    froms = [rest for word, rest in _instructions() if word == "FROM"]
    assert froms == ["${CUDA_IMAGE}"]
    assert args["CUDA_IMAGE"].startswith("nvidia/cuda:")


def test_every_shipped_package_is_copied_and_exists() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = {pattern.rstrip("*") for pattern in include}
    copied = set()
    for word, rest in _instructions():
        if word == "COPY":
            *sources, _dest = rest.split()
            for source in sources:
                assert (REPO / source).exists(), f"COPY of a missing path: {source}"
                copied.add(source)
    assert shipped <= copied, f"packages the image lacks: {sorted(shipped - copied)}"


def test_installs_gpu_extras_with_torch_pinned_first() -> None:
    runs = [rest for word, rest in _instructions() if word == "RUN"]
    torch_at = next(i for i, r in enumerate(runs) if 'pip install "torch==' in r)
    extras_at = next(i for i, r in enumerate(runs) if "[serve,transfer,gpu]" in r)
    assert torch_at < extras_at


def test_default_command_is_accepted_by_the_cli() -> None:
    cmd = next(rest for word, rest in _instructions() if word == "CMD")
    args = parse_serve(json.loads(cmd))
    assert args.host == "0.0.0.0"
