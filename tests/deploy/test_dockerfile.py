"""deploy/Dockerfile cannot be built here (no Docker engine), so check what can be checked
statically: it copies every package Baton ships, installs the extras a GPU node needs,
and its default command is one the CLI accepts. The build context is checked in
test_build_context.py, the linter in test_hadolint.py."""

from __future__ import annotations

import tomllib

from tests.deploy.image import REPO, commands, copy_sources
from tests.deploy.serve_command import parse_serve


def _values(instruction: str) -> list[tuple[str, ...]]:
    """The arguments of every `instruction` line, as BuildKit's parser splits them."""
    return [c.value for c in commands() if c.cmd == instruction]


def test_base_image_is_cuda() -> None:
    args = dict(value[0].split("=", 1) for value in _values("ARG") if "=" in value[0])
    assert _values("FROM") == [("${CUDA_IMAGE}",)]
    assert args["CUDA_IMAGE"].startswith("nvidia/cuda:")


def test_every_shipped_package_is_copied_and_exists() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = {pattern.rstrip("*") for pattern in include}
    copied = set(copy_sources())
    for source in copied:
        assert (REPO / source).exists(), f"COPY of a missing path: {source}"
    assert shipped <= copied, f"packages the image lacks: {sorted(shipped - copied)}"


def test_installs_gpu_extras_with_torch_pinned_first() -> None:
    runs = [value[0] for value in _values("RUN")]
    torch_at = next(i for i, r in enumerate(runs) if 'pip install "torch==' in r)
    extras_at = next(i for i, r in enumerate(runs) if "[serve,transfer,gpu]" in r)
    assert torch_at < extras_at


def test_default_command_is_accepted_by_the_cli() -> None:
    (cmd,) = _values("CMD")
    args = parse_serve(list(cmd))
    assert args.host == "0.0.0.0"
