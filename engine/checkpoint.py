"""Finding and reading the safetensors weights of a Hugging Face model folder.

A folder holds either one `model.safetensors`, or shards listed by
`model.safetensors.index.json` (`{"weight_map": {tensor name: shard file}}`). Everything is
checked before the first tensor is handed out, so a broken download fails at start-up with a
message naming the missing piece instead of half-way through loading. Tensors are
memory-mapped (`safe_open`), so reading a shard costs page cache, not a private copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from engine.json_files import read_json_object

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """Weights are missing, inconsistent with their index, or don't fit the model."""


def list_weight_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a model folder, in a stable order, after checking them."""
    folder = Path(model_dir)
    if not folder.is_dir():
        raise CheckpointError(f"model folder {folder} does not exist or is not a folder")
    index_path = folder / INDEX_FILE
    if index_path.is_file():
        weight_map = _read_weight_map(index_path)
        files = sorted({folder / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index_path}: lists shard(s) that don't exist: {missing}")
        _check_index_matches_shards(index_path, weight_map, files)
        return files
    single = folder / SINGLE_FILE
    if single.is_file():
        return [single]
    found = sorted(p.name for p in folder.glob("*.safetensors"))
    hint = f" (found {found} but no {INDEX_FILE})" if found else ""
    raise CheckpointError(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE}{hint}")


def iter_weights(
    model_dir: str | Path, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (HF tensor name, tensor) for every tensor of the checkpoint, cast to `dtype`."""
    for path in list_weight_files(model_dir):
        with safe_open(str(path), framework="pt") as shard:
            for name in shard.keys():  # noqa: SIM118 - safe_open is not a Mapping
                tensor = shard.get_tensor(name)
                if dtype is not None and tensor.dtype != dtype:
                    tensor = tensor.to(dtype)
                yield name, tensor


def check_shape(
    name: str, expected: tuple[int, ...], got: tuple[int, ...], file: str | Path
) -> None:
    """Raises if a checkpoint tensor's shape differs from the parameter it is loaded into."""
    if tuple(expected) != tuple(got):
        raise CheckpointError(
            f"{file}: tensor '{name}' has shape {list(got)}, but the model expects "
            f"{list(expected)} (does config.json match these weights?)"
        )


def _read_weight_map(index_path: Path) -> dict[str, str]:
    weight_map = read_json_object(index_path, CheckpointError).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path}: needs a non-empty 'weight_map' object")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or "/" in shard or "\\" in shard or shard.startswith("."):
            # A shard path escaping the folder is never legitimate in a HF checkpoint.
            raise CheckpointError(f"{index_path}: tensor '{name}' maps to bad file {shard!r}")
    return weight_map


def _check_index_matches_shards(
    index_path: Path, weight_map: dict[str, str], files: list[Path]
) -> None:
    """Every tensor the index names must be in the shard it names (reads headers only)."""
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as shard:
                present = set(shard.keys())
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from exc
        expected = {name for name, shard in weight_map.items() if shard == path.name}
        missing = sorted(expected - present)
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise CheckpointError(
                f"{index_path}: {len(missing)} tensor(s) listed for {path.name} are not in it: "
                f"{shown}"
            )
