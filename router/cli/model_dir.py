"""Which checkpoint a command serves: the folder given, or the tiny demo model, made on
first use (random weights, real HF format) so that `baton serve` works on a fresh machine."""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MODEL_DIR = Path("models/tiny-llama")


def resolve_model(model: str | None, command: str) -> Path:
    """`model` if it is a Hugging Face checkpoint folder (else exit naming `command`); with
    no model, the demo model under models/, made if missing."""
    if model:
        path = Path(model).expanduser().resolve()
        if not (path / "config.json").exists():
            raise SystemExit(
                f"baton {command}: {path} is not a Hugging Face checkpoint folder (no config.json)"
            )
        return path
    path = DEFAULT_MODEL_DIR.resolve()
    if not (path / "config.json").exists():
        from engine.tiny_model import make_tiny_model

        logger.info("no --model given: making the tiny demo model at %s", path)
        make_tiny_model(path, arch="llama", preset="tiny", seed=0)
    return path
