"""A worker's `core.preflight.WorkerFacts`: read from its engine and its model folder once,
when the worker starts, and sent with its WorkerInfo to the controller's preflight."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from core.preflight import WorkerFacts

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
)
"""The files a tokenizer is loaded from (Hugging Face's names); the ones present are hashed."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
_EDGE_BYTES = 1 << 20
"""A weight file is fingerprinted by its size and its first and last MiB: cheap on a
multi-GiB checkpoint, and two different trainings of one architecture differ there."""


def tokenizer_hash(model_dir: str | Path) -> str:
    """sha256 over the tokenizer files present (name and bytes); "" when there is none."""
    folder = Path(model_dir)
    digest = hashlib.sha256()
    found = False
    for name in TOKENIZER_FILES:
        path = folder / name
        if path.is_file():
            found = True
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16] if found else ""


def weights_fingerprint(model_dir: str | Path) -> str:
    """sha256 over each weight file's name, size, first and last MiB (sorted by name)."""
    digest = hashlib.sha256()
    for path in sorted(Path(model_dir).iterdir()):
        if not path.is_file() or not path.name.endswith(WEIGHT_SUFFIXES):
            continue
        size = path.stat().st_size
        digest.update(f"{path.name}\0{size}\0".encode())
        with path.open("rb") as f:
            digest.update(f.read(_EDGE_BYTES))
            f.seek(max(0, size - _EDGE_BYTES))
            digest.update(f.read(_EDGE_BYTES))
    return digest.hexdigest()[:16]


def worker_facts(model_dir: str, engine: Any, tp_size: int) -> WorkerFacts:
    """The facts of a worker whose engine (an engine.engine.LLMEngine) is built."""
    model = engine.model_config
    return WorkerFacts(
        model_id=model.model_id,
        weights=weights_fingerprint(model_dir),
        vocab_size=model.vocab_size,
        tokenizer=tokenizer_hash(model_dir),
        num_layers=model.num_hidden_layers,
        num_kv_heads=model.num_key_value_heads,
        head_dim=model.head_dim,
        rope_theta=float(model.rope_theta),
        rope_scaling=json.dumps(model.rope_scaling, sort_keys=True) if model.rope_scaling else "",
        block_size=engine.config.block_size,
        kv_cache_dtype=engine.runner.kv_layout.dtype,
        tp_size=tp_size,
        max_lora_rank=engine.config.max_lora_rank if engine.config.max_loras else 0,
    )
