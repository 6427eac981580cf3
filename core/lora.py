"""A LoRA adapter as a request names it: its served name, its PEFT folder and a digest of
its config and weights.

The digest makes an adapter's identity its content, not its name: the KV a request computes
under an adapter is hashed with `hash_extra` (core/hashing.py's `extra`), so two adapters,
or one name loaded again from changed files, never share a prefix-cache block, on a worker
or in the router's index. Every worker checks the digest when it loads the folder, so a file
changed after the front door read it is refused rather than served under the old name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import xxhash

from core.errors import InvalidRequestError

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
"""PEFT's `save_pretrained` writes one of these (safetensors unless told otherwise)."""


@dataclass(frozen=True)
class LoRARef:
    name: str
    """What clients put in `model` to use it."""
    path: str
    """The PEFT folder (adapter_config.json and the weights), readable by every worker."""
    digest: str
    """xxh3-64 of its config and weights files, hex (`digest_of`)."""

    @property
    def hash_extra(self) -> bytes:
        """What its KV blocks' hashes carry besides the tokens."""
        return f"lora|{self.name}|{self.digest}".encode()


def weight_file(folder: Path) -> Path:
    """The folder's adapter weights; InvalidRequestError if it holds no PEFT adapter."""
    if not (folder / CONFIG_FILE).is_file():
        raise InvalidRequestError(f"lora_path: {str(folder)!r} holds no {CONFIG_FILE}")
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise InvalidRequestError(f"lora_path: {str(folder)!r} holds none of {', '.join(WEIGHT_FILES)}")


def digest_of(folder: Path) -> str:
    """xxh3-64 of the adapter's config (its alpha scales the weights) and weights, hex."""
    h = xxhash.xxh3_64((folder / CONFIG_FILE).read_bytes())
    with weight_file(folder).open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return f"{h.intdigest():016x}"


def read_config(folder: Path) -> dict:
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError) as e:
        raise InvalidRequestError(f"lora_path: cannot read {folder / CONFIG_FILE}: {e}") from e
    if not isinstance(config, dict):
        raise InvalidRequestError(f"lora_path: {folder / CONFIG_FILE} is not a JSON object")
    return config


def lora_ref(name: str, path: str | Path) -> LoRARef:
    """The adapter at `path`, served as `name`: its folder checked and its weights digested.
    Raises InvalidRequestError naming the field at fault."""
    if not name.strip() or name != name.strip():
        raise InvalidRequestError(f"lora_name: {name!r} is not a usable model name")
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise InvalidRequestError(f"lora_path: {str(path)!r} is not a folder")
    config = read_config(folder)
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise InvalidRequestError(
            f"lora_path: {str(path)!r} holds a {config.get('peft_type')} adapter; only LORA "
            "adapters are served"
        )
    return LoRARef(name, str(folder), digest_of(folder))


def parse_lora_module(text: str) -> tuple[str, str]:
    """`name=DIR` (vLLM's `--lora-modules` form) -> (name, DIR)."""
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ValueError(f"--lora-modules: expected NAME=DIR, got {text!r}")
    return name.strip(), path.strip()
