"""Finding and reading the safetensors weights of a Hugging Face model folder.

A folder holds either one `model.safetensors`, or shards listed by
`model.safetensors.index.json` (`{"weight_map": {tensor name: shard file}}`). Everything is
checked before the first tensor is handed out, so a broken download fails at start-up with a
message naming the missing piece instead of half-way through loading.

Tensors are handed out as read-only views of the memory-mapped shard, in the file's dtype,
and `copy_into` casts them into their parameter: loading holds the weights plus at most one
bounded chunk, never a second full-size copy. (safetensors' own `get_tensor`, and
`get_slice` with its default backend, read the whole tensor, or the whole file, into memory
torch allocates first.) A shard is laid out as

    | u64 little-endian: N | N bytes of JSON header | data ... |
    header: {name: {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, ...}
    with begin and end counted from the start of the data.
"""

from __future__ import annotations

import json
import math
import mmap
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.json_files import read_json_object

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
COPY_CHUNK_BYTES = 64 << 20
"""Most bytes `copy_into` copies at once."""
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_MAX_HEADER_BYTES = 100 << 20  # safetensors refuses larger headers too


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


def num_elements(model_dir: str | Path) -> int:
    """Elements in every tensor of the checkpoint, from the shards' headers alone."""
    return sum(
        math.prod(entry.shape)
        for path in list_weight_files(model_dir)
        for entry in _read_header(path)[1].values()
    )


def iter_weights(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (HF tensor name, tensor) for every tensor of the checkpoint, in the dtype it
    is stored in. The tensors are read-only views of the mapped file: copy them (with
    `copy_into`), never write to them."""
    for path in list_weight_files(model_dir):
        shard = _MappedShard(path)
        for name in shard.entries:
            yield name, shard.tensor(name)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst <- src (same shape), cast to dst's dtype on the way, COPY_CHUNK_BYTES of rows at
    a time. On one device `copy_` casts in place with no temporary, but a host-to-device copy
    that casts (or reads a strided TP slice) first makes a contiguous host copy of its source
    in the target dtype: the chunks bound that copy (on one device they cost nothing)."""
    if src.dim() == 0 or src.numel() == 0:
        dst.copy_(src)
        return
    row_bytes = max(1, math.prod(src.shape[1:]) * max(src.element_size(), dst.element_size()))
    rows = max(1, COPY_CHUNK_BYTES // row_bytes)
    for start in range(0, src.shape[0], rows):
        n = min(rows, src.shape[0] - start)
        dst.narrow(0, start, n).copy_(src.narrow(0, start, n))


@dataclass(frozen=True)
class _Entry:
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    """Byte offset from the start of the data."""


class _MappedShard:
    """One safetensors file: its header, checked, and its tensors as views of the mapping."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data_start, self.entries = _read_header(path)
        with path.open("rb") as f:
            # Read-only: the views are never written, and a private writable mapping would
            # be charged against the commit limit for the whole file.
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def tensor(self, name: str) -> torch.Tensor:
        entry = self.entries[name]
        count = math.prod(entry.shape)
        if count == 0:
            return torch.empty(entry.shape, dtype=entry.dtype)
        with warnings.catch_warnings():
            # torch warns that it cannot mark the tensor read-only; iter_weights says so.
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            flat = torch.frombuffer(
                self._map, dtype=entry.dtype, count=count, offset=self.data_start + entry.begin
            )
        return flat.view(entry.shape)


def _read_header(path: Path) -> tuple[int, dict[str, _Entry]]:
    """(offset of the data in the file, {name: entry}), after checking that every tensor's
    bytes lie inside the file and match its shape and dtype."""

    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"{path}: not a readable safetensors file ({problem})")

    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise bad("shorter than its 8-byte header length")
        header_len = int.from_bytes(prefix, "little")
        if header_len > min(_MAX_HEADER_BYTES, size - 8):
            raise bad(f"header length {header_len} exceeds the file")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise bad(f"header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    data_start = 8 + header_len
    data_len = size - data_start
    entries: dict[str, _Entry] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES[spec["dtype"]]
            shape = tuple(int(d) for d in spec["shape"])
            begin, end = (int(o) for o in spec["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise bad(f"tensor '{name}' has a malformed entry {spec!r}") from exc
        nbytes = math.prod(shape) * dtype.itemsize
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= data_len or end - begin != nbytes:
            raise bad(
                f"tensor '{name}' ({spec['dtype']} {list(shape)}) has data_offsets "
                f"[{begin}, {end}], which do not fit its {nbytes} bytes in the file's "
                f"{data_len} bytes of data"
            )
        entries[name] = _Entry(dtype, shape, begin)
    return data_start, entries


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
        present = set(_read_header(path)[1])
        expected = {name for name, shard in weight_map.items() if shard == path.name}
        missing = sorted(expected - present)
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise CheckpointError(
                f"{index_path}: {len(missing)} tensor(s) listed for {path.name} are not in it: "
                f"{shown}"
            )
