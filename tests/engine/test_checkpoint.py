"""Finding and reading safetensors checkpoints, single-file and sharded, and their errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.checkpoint import CheckpointError, check_shape, iter_weights, list_weight_files

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


def test_cast_on_read(tiny_model_dir) -> None:
    weights = dict(iter_weights(tiny_model_dir("qwen3"), dtype=torch.bfloat16))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}


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
