"""A GGUF file's metadata as a Hugging Face config.json (and generation_config.json)."""

from __future__ import annotations

from typing import Any

from gguf import GGUFReader

ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "mistral": ("mistral", "MistralForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
}
"""GGUF `general.architecture` -> (model_type, architectures[0])."""
PERMUTED_QK = {"llama", "mistral"}
"""Architectures whose q / k projections llama.cpp's converter stores permuted (rotary pairs
interleaved): `tensors.py` undoes it."""


class GGUFError(ValueError):
    """A GGUF file this project cannot import; the message names what is not handled."""


def field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    entry = reader.fields.get(key)
    return default if entry is None else entry.contents()


def architecture(reader: GGUFReader) -> str:
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        known = ", ".join(ARCHITECTURES)
        raise GGUFError(f"GGUF architecture {arch!r} is not handled (handled: {known})")
    return arch


def hf_config(reader: GGUFReader, tensor_names: set[str]) -> dict[str, Any]:
    """config.json for the file's model."""
    arch = architecture(reader)

    def get(name: str, default: Any = None) -> Any:
        value = field(reader, f"{arch}.{name}", default)
        if value is None:
            raise GGUFError(f"GGUF metadata {arch}.{name} is missing")
        return value

    if "rope_freqs.weight" in tensor_names or field(reader, f"{arch}.rope.scaling.type"):
        raise GGUFError("GGUF rope scaling (rope_freqs / rope.scaling.*) is not handled")
    model_type, class_name = ARCHITECTURES[arch]
    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    tokens = field(reader, "tokenizer.ggml.tokens") or []
    config: dict[str, Any] = {
        "architectures": [class_name],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length")),
        "vocab_size": int(get("vocab_size", len(tokens))),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "torch_dtype": "float32",
    }
    if model_type == "qwen2":
        config["attention_bias"] = True  # Qwen2's q / k / v projections carry a bias
    for key, name in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        token_id = field(reader, f"tokenizer.ggml.{name}")
        if token_id is not None:
            config[key] = int(token_id)
    return config


def generation_config(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}
