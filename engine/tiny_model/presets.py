"""Tiny-model sizes and the config.json each architecture family writes for them."""

from __future__ import annotations

from typing import Any

ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {
        "vocab_size": 1024,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
    },
    "small": {  # ~125M parameters
        "vocab_size": 32000,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "intermediate_size": 2048,
        "max_position_embeddings": 4096,
    },
    # Sizes `--train` (engine/tiny_model/train.py) trains in a few minutes on two cores.
    "trained": {  # ~5M parameters
        "vocab_size": 2048,
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 768,
        "max_position_embeddings": 2048,
    },
    "draft": {  # ~1M parameters, the same tokenizer: a draft model for `trained`
        "vocab_size": 2048,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 384,
        "max_position_embeddings": 2048,
    },
}
DTYPES = ("float32", "bfloat16", "float16")
# What make_tiny_model accepts besides arch, preset, seed and dtype.
OVERRIDES = (
    *PRESETS["tiny"],
    "tie_word_embeddings",
    "head_dim",
    "rope_theta",
    "rope_scaling",  # "llama3" or None (llama only)
    "sliding_window",
    "shards",
    "force",
)
# Real checkpoints of each family tie embeddings like this at small sizes.
_DEFAULT_TIE = {"llama": False, "mistral": False, "qwen2": True, "qwen3": True}


def check_choices(arch: str, preset: str, dtype: str, overrides: dict[str, Any]) -> None:
    """Raises ValueError naming the allowed values for anything make_tiny_model can't make."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown arch {arch!r}; choose from {', '.join(ARCHITECTURES)}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    unknown = sorted(set(overrides) - set(OVERRIDES))
    if unknown:
        raise ValueError(f"unknown override(s) {unknown}; allowed: {', '.join(OVERRIDES)}")


def build_config(arch: str, preset: str, dtype: str, **overrides: Any) -> dict[str, Any]:
    """The config.json dict for an arch and preset (written in the transformers 4.x spelling,
    `rope_theta` + `rope_scaling`, which transformers 5 reads too)."""
    size = {**PRESETS[preset], **{k: v for k, v in overrides.items() if k in PRESETS[preset]}}
    hidden, heads = size["hidden_size"], size["num_attention_heads"]
    if hidden % heads or heads % size["num_key_value_heads"]:
        raise ValueError(
            f"num_attention_heads ({heads}) must divide hidden_size ({hidden}) and be a "
            f"multiple of num_key_value_heads ({size['num_key_value_heads']})"
        )
    architecture, model_type = ARCHITECTURES[arch]
    # Qwen3 decouples head_dim from hidden/heads (0.6B: 1024 / 16 heads, head_dim 128).
    head_dim = overrides.get("head_dim") or (2 * hidden // heads if arch == "qwen3" else None)
    tie = overrides.get("tie_word_embeddings")
    config: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
        **size,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5 if arch == "llama" else 1e-6,
        "rope_theta": float(overrides.get("rope_theta") or (5e5 if arch == "llama" else 1e6)),
        "tie_word_embeddings": _DEFAULT_TIE[arch] if tie is None else bool(tie),
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "torch_dtype": dtype,
    }
    if head_dim is not None:
        config["head_dim"] = int(head_dim)
    window = overrides.get("sliding_window")
    if arch == "llama":
        config.update(attention_bias=False, mlp_bias=False)
        rope_scaling = overrides.get("rope_scaling", "llama3")
        if rope_scaling == "llama3":
            # Llama 3.1 shape; original context a quarter of the max so scaling matters.
            config["rope_scaling"] = {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": size["max_position_embeddings"] // 4,
            }
        elif rope_scaling is not None:
            raise ValueError(f"rope_scaling must be 'llama3' or None, got {rope_scaling!r}")
    elif overrides.get("rope_scaling") is not None:
        raise ValueError("rope_scaling is only offered for arch 'llama'")
    if arch == "mistral":
        config["sliding_window"] = window
    if arch in ("qwen2", "qwen3"):
        # As shipped by Qwen: a window is configured but off unless use_sliding_window.
        layers = size["num_hidden_layers"]
        config.update(
            use_sliding_window=window is not None,
            sliding_window=window if window is not None else size["max_position_embeddings"],
            max_window_layers=layers // 2 if window is not None else layers,
        )
        if arch == "qwen3":
            config["attention_bias"] = False
    elif arch == "llama" and window is not None:
        raise ValueError("sliding_window is offered for mistral, qwen2 and qwen3 only")
    return config
