"""Importing a GGUF file as a Hugging Face folder, and finding the folder a GGUF path was
imported into before (so `baton serve --model FILE.gguf` imports once)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from core.cache_dir import cache_dir
from engine.gguf.config import GGUFError, architecture, generation_config, hf_config
from engine.gguf.tensors import hf_tensors
from engine.gguf.tokenizer import hf_tokenizer

__all__ = ["GGUFError", "import_gguf", "is_gguf", "resolve_model"]
_MAGIC = b"GGUF"


def is_gguf(path: str | Path) -> bool:
    """A file that starts as a GGUF file does (its suffix does not matter)."""
    path = Path(path)
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == _MAGIC


def import_gguf(src: str | Path, dst: str | Path) -> Path:
    """Write the GGUF file `src` as a Hugging Face folder `dst` (made whole or not at all:
    written beside it, then renamed into place)."""
    from gguf import GGUFReader

    src, dst = Path(src), Path(dst)
    if not is_gguf(src):
        raise GGUFError(f"{src} is not a GGUF file")
    reader = GGUFReader(src)
    arch = architecture(reader)
    config = hf_config(reader, {t.name for t in reader.tensors})
    tokenizer_json, tokenizer_config = hf_tokenizer(reader)
    tensors = {name: torch.from_numpy(values) for name, values in hf_tensors(reader, arch, config)}
    dst.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        save_file(tensors, work / "model.safetensors", metadata={"format": "pt"})
        files = {
            "config.json": config,
            "generation_config.json": generation_config(config),
            "tokenizer_config.json": tokenizer_config,
        }
        for name, content in files.items():
            (work / name).write_text(json.dumps(content, indent=1) + "\n")
        (work / "tokenizer.json").write_text(tokenizer_json)
        (work / "source.txt").write_text(f"imported from {src.name} by baton import-gguf\n")
        for path in (work, *work.iterdir()):  # mkdtemp made it private
            path.chmod(0o755 if path.is_dir() else 0o644)
        if dst.exists():
            shutil.rmtree(dst)
        os.replace(work, dst)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return dst


def resolve_model(model: str | Path) -> Path:
    """`model` itself for a folder; for a GGUF file, the folder it was imported into, importing
    it first if it was not yet: in the user's cache under the file's path, size and
    modification time, named after the file (the name a server gives the model)."""
    path = Path(model)
    if not is_gguf(path):
        return path
    stat = path.stat()
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    folder = cache_dir("gguf") / hashlib.sha256(key).hexdigest()[:16] / path.stem
    if not (folder / "config.json").is_file():
        import_gguf(path, folder)
    return folder
