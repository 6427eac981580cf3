"""Shared engine fixtures. `tiny_model_dir` makes random-weight HF checkpoints once per
session (cached per arch and options), for parity tests against transformers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.tiny_model import make_tiny_model

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: `tiny_model_dir("qwen3", dtype="bfloat16", shards=2) -> Path`.

    Arguments are those of `make_tiny_model` (arch, preset, seed, dtype, size overrides).
    The same arguments return the same folder; treat it as read-only.
    """
    made: dict[tuple[str, tuple[tuple[str, Any], ...]], Path] = {}

    def make(arch: str = "llama", **options: Any) -> Path:
        key = (arch, tuple(sorted(options.items())))
        if key not in made:
            folder = tmp_path_factory.mktemp(f"tiny-{arch}")
            made[key] = make_tiny_model(folder, arch=arch, **options)
        return made[key]

    return make
