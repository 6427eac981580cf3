"""make_tiny_model writes folders transformers loads as is, deterministically, for every arch."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from engine.tiny_model import (
    PRESETS,
    build_arg_parser,
    build_config,
    make_tiny_model,
    parameter_shapes,
    run_from_args,
)

ARCHS = ("llama", "mistral", "qwen2", "qwen3")


def load_hf(folder: Path):
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    return model.eval(), info


@pytest.mark.parametrize("arch", ARCHS)
def test_loads_in_transformers_with_exact_names_and_shapes(tiny_model_dir, arch: str) -> None:
    folder = tiny_model_dir(arch)
    model, info = load_hf(folder)
    assert {k: v for k, v in info.items() if v} == {}  # no missing/unexpected/mismatched keys
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        ours = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    theirs = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        theirs.pop("lm_head.weight")
    assert ours == theirs


PROMPTS = (
    "The lighthouse keeper wrote",
    "def fibonacci(n):",
    "Once upon a time",
    "café déjà vu 東京",
    "SELECT customer FROM orders",
    "1 + 1 =",
)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generation_is_robust(tiny_model_dir, arch: str) -> None:
    """Logits are finite with a clear top-1 (far above fp32 noise, so engine-vs-transformers
    parity is meaningful), and greedy output does not collapse into one repeated token."""
    from transformers import AutoTokenizer

    folder = tiny_model_dir(arch)
    model, _ = load_hf(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    collapsed = 0
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(
                ids,
                max_new_tokens=16,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=tokenizer.pad_token_id,
            )
        scores = torch.stack(out.scores)[:, 0]
        assert torch.isfinite(scores).all()
        top2 = scores.topk(2, dim=-1).values
        assert (top2[:, 0] - top2[:, 1]).min() > 1e-4, prompt
        assert scores.std(dim=-1).min() > 1.0  # a healthy spread, not near-uniform logits
        new_tokens = out.sequences[0, ids.shape[1] :].tolist()
        collapsed += len(set(new_tokens[-8:])) == 1
    assert collapsed <= len(PROMPTS) // 3


def test_same_args_same_bytes_and_seed_changes_weights(tmp_path: Path) -> None:
    a = make_tiny_model(tmp_path / "a", arch="qwen3", seed=3, num_hidden_layers=2)
    b = make_tiny_model(tmp_path / "b", arch="qwen3", seed=3, num_hidden_layers=2)
    c = make_tiny_model(tmp_path / "c", arch="qwen3", seed=4, num_hidden_layers=2)
    names = sorted(p.name for p in a.iterdir() if p.is_file())
    assert names == sorted(p.name for p in b.iterdir() if p.is_file())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()


def test_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    folder = make_tiny_model(tmp_path / "m", num_hidden_layers=1)
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="--force"):
        make_tiny_model(folder, num_hidden_layers=1)
    make_tiny_model(folder, arch="mistral", num_hidden_layers=1, shards=2, force=True)
    assert not (folder / "model.safetensors").exists()  # replaced by the shards
    assert (folder / "model.safetensors.index.json").exists()
    assert (folder / "notes.txt").read_text() == "keep me"


def test_bfloat16_and_sharded_folder_loads(tiny_model_dir) -> None:
    folder = tiny_model_dir("llama", dtype="bfloat16", shards=2)
    config = json.loads((folder / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"
    model, info = load_hf(folder)
    assert {k: v for k, v in info.items() if v} == {}
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16


def test_presets_and_overrides() -> None:
    small = build_config("llama", "small", "float32")
    num_params = sum(torch.Size(s).numel() for s in parameter_shapes(small).values())
    assert 100e6 < num_params < 150e6
    assert PRESETS["tiny"]["vocab_size"] == 1024
    assert build_config("qwen3", "tiny", "float32")["head_dim"] == 32
    assert "rope_scaling" not in build_config("llama", "tiny", "float32", rope_scaling=None)
    window = build_config("qwen2", "tiny", "float32", sliding_window=64)
    assert window["use_sliding_window"] and window["max_window_layers"] == 2
    with pytest.raises(ValueError, match="must divide"):
        build_config("llama", "tiny", "float32", hidden_size=66)
    with pytest.raises(ValueError, match="unknown override"):
        make_tiny_model("/nonexistent", hidden=3)
    with pytest.raises(ValueError, match="unknown arch"):
        make_tiny_model("/nonexistent", arch="gpt2")


def test_cli(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    build_arg_parser(parser)
    folder = tmp_path / "cli"
    args = parser.parse_args(
        [str(folder), "--arch", "qwen2", "--num-layers", "1", "--hidden-size", "32", "--no-tie"]
    )
    assert run_from_args(args) == 0
    config = json.loads((folder / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"]) == (1, 32)
    assert config["tie_word_embeddings"] is False
    assert run_from_args(args) == 2  # exists, no --force
    done = subprocess.run(
        [sys.executable, "-m", "engine.tiny_model", str(folder), "--force", "--num-layers", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(folder)
