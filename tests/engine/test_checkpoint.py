"""Finding and reading safetensors checkpoints, single-file and sharded, and their errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine import checkpoint
from engine.checkpoint import (
    CheckpointError,
    check_shape,
    copy_into,
    iter_weights,
    list_weight_files,
)

INDEX = "model.safetensors.index.json"


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_single_file(tiny_model_dir) -> None:
    folder = tiny_model_dir("llama")
    assert list_weight_files(folder) == [folder / "model.safetensors"]
    weights = dict(iter_weights(folder))
    assert weights["model.embed_tokens.weight"].shape == (1024, 64)
    assert "lm_head.weight" in weights and all(t.dtype == torch.float32 for t in weights.values())


def test_sharded_matches_single_file(tiny_model_dir) -> None:
    single = dict(iter_weights(tiny_model_dir("qwen2")))
    folder = tiny_model_dir("qwen2", shards=3)
    files = list_weight_files(folder)
    assert [f.name for f in files] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    sharded = dict(iter_weights(folder))
    assert sharded.keys() == single.keys()
    assert all(torch.equal(sharded[name], single[name]) for name in single)
    index = json.loads((folder / INDEX).read_text())
    assert set(index["weight_map"]) == set(single)
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in single.values())


def test_tensors_are_the_files_as_stored(tiny_model_dir) -> None:
    """Read through our own mapping, every tensor equals what safetensors reads, in the
    dtype the file stores (the loaders cast; reading never does)."""
    folder = tiny_model_dir("qwen3", dtype="bfloat16")
    weights = dict(iter_weights(folder))
    with safe_open(str(folder / "model.safetensors"), framework="pt") as shard:
        assert weights.keys() == set(shard.keys())
        for name, tensor in weights.items():
            expected = shard.get_tensor(name)
            assert tensor.dtype == torch.bfloat16 and tensor.shape == expected.shape
            assert torch.equal(tensor, expected), name


def test_odd_tensors_read_back(tmp_path: Path) -> None:
    tensors = {
        "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(2.5, dtype=torch.float16),
        "ints": torch.arange(7, dtype=torch.int64),
        "flags": torch.tensor([True, False, True]),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    read = dict(iter_weights(tmp_path))
    assert read.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert read[name].dtype == tensor.dtype and torch.equal(read[name], tensor), name


def _shard_bytes(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\x01\x00", "shorter than its 8-byte header length"),
        ((1 << 40).to_bytes(8, "little") + b"{}", "header length"),
        (_shard_bytes([], b""), "not a JSON object"),  # type: ignore[arg-type]
        (_shard_bytes({"w": {"dtype": "F32", "shape": [2]}}, b"\0" * 8), "malformed"),
        (_shard_bytes({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, b""), "Q4"),
        (
            _shard_bytes({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8),
            r"tensor 'w' \(F32 \[4\]\) has data_offsets \[0, 16\].*16 bytes.*8 bytes of data",
        ),
        (
            _shard_bytes({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 8),
            r"data_offsets \[0, 4\], which do not fit its 8 bytes",
        ),
    ],
)
def test_broken_shard(tmp_path: Path, content: bytes, problem: str) -> None:
    (tmp_path / "model.safetensors").write_bytes(content)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable") as err:
        list(iter_weights(tmp_path))
    assert err.match(problem)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_copy_into_casts_in_row_chunks(monkeypatch: pytest.MonkeyPatch, dtype) -> None:
    """Chunks of a few rows give the whole cast, for whole tensors, 1-D ones, and the
    strided column slice a row-parallel rank loads."""
    monkeypatch.setattr(checkpoint, "COPY_CHUNK_BYTES", 3 * 5 * 4)  # 3 rows of 5 floats
    full = torch.randn(11, 10)
    for src in (full, full[:, 5:], full[4], torch.randn(7)):
        dst = torch.empty(src.shape, dtype=dtype)
        copy_into(dst, src)
        assert torch.equal(dst, src.to(dtype))


def test_missing_shard(tmp_path: Path, tiny_model_dir) -> None:
    folder = copy_model(tiny_model_dir("qwen2", shards=3), tmp_path / "m")
    (folder / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model-00002-of-00003\.safetensors"):
        list_weight_files(folder)


def test_tensor_missing_from_its_shard(tmp_path: Path, tiny_model_dir) -> None:
    folder = copy_model(tiny_model_dir("qwen2", shards=3), tmp_path / "m")
    index = json.loads((folder / INDEX).read_text())
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00003.safetensors"
    (folder / INDEX).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"model\.layers\.9\.mlp\.up_proj\.weight"):
        list(iter_weights(folder))


def test_bad_index(tmp_path: Path) -> None:
    (tmp_path / INDEX).write_text("{")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        list_weight_files(tmp_path)
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(CheckpointError, match="weight_map"):
        list_weight_files(tmp_path)
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": {"w": "../escape.safetensors"}}))
    with pytest.raises(CheckpointError, match="bad file"):
        list_weight_files(tmp_path)


def test_no_weights(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        list_weight_files(tmp_path / "nope")
    with pytest.raises(CheckpointError, match=r"no model\.safetensors"):
        list_weight_files(tmp_path)
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    with pytest.raises(CheckpointError, match=r"found \['model-00001-of-00002\.safetensors'\]"):
        list_weight_files(tmp_path)


def test_check_shape_names_tensor_shapes_and_file() -> None:
    check_shape("w", (2, 3), (2, 3), "a.safetensors")
    with pytest.raises(CheckpointError) as err:
        check_shape("model.norm.weight", (64,), (32,), "model.safetensors")
    message = str(err.value)
    assert "model.norm.weight" in message and "[32]" in message and "[64]" in message
    assert "model.safetensors" in message
