"""A worker's facts (worker/facts.py) from a real engine: what the preflight compares."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from core.config import EngineConfig
from engine.engine import LLMEngine
from worker.facts import tokenizer_hash, weights_fingerprint, worker_facts


def test_facts_of_a_tiny_model(tiny_model_dir) -> None:
    model_dir = tiny_model_dir("llama")
    config = EngineConfig(num_kv_blocks=32, block_size=32, kv_cache_dtype="int8", device="cpu")
    engine = LLMEngine(Path(model_dir), config)
    facts = worker_facts(str(model_dir), engine, tp_size=1)
    model = engine.model_config
    assert facts.model_id == model.model_id
    assert (facts.num_layers, facts.num_kv_heads, facts.head_dim) == (
        model.num_hidden_layers,
        model.num_key_value_heads,
        model.head_dim,
    )
    assert (facts.block_size, facts.kv_cache_dtype, facts.tp_size) == (32, "int8", 1)
    assert facts.vocab_size == model.vocab_size
    assert facts.tokenizer and facts.weights
    assert facts.max_lora_rank == 0  # it serves no LoRA adapters
    lora = LLMEngine(Path(model_dir), replace(config, max_loras=2, max_lora_rank=8))
    assert worker_facts(str(model_dir), lora, tp_size=1).max_lora_rank == 8


def test_tokenizer_and_weights_are_told_apart(tiny_model_dir, tmp_path) -> None:
    model_dir = Path(tiny_model_dir("llama"))
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    assert tokenizer_hash(copy) == tokenizer_hash(model_dir)
    assert weights_fingerprint(copy) == weights_fingerprint(model_dir)
    with (copy / "tokenizer_config.json").open("a") as f:
        f.write("\n")
    assert tokenizer_hash(copy) != tokenizer_hash(model_dir)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert weights_fingerprint(copy) != weights_fingerprint(model_dir)
    assert tokenizer_hash(tmp_path) == ""
