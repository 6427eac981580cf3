"""ModelConfig.from_dir: every supported arch, both rope spellings, and clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from engine.config import ModelConfig, ModelConfigError

ARCHS = ("llama", "mistral", "qwen2", "qwen3")

BASE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def write_config(folder: Path, config: dict[str, Any], generation: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


def parse(tmp_path: Path, generation: dict | None = None, **changes: Any) -> ModelConfig:
    config = {**BASE, **changes}
    config = {k: v for k, v in config.items() if v is not None}
    return ModelConfig.from_dir(write_config(tmp_path / "m", config, generation))


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_models_match_transformers_config(tiny_model_dir, arch: str) -> None:
    from transformers import AutoConfig

    folder = tiny_model_dir(arch)
    ours = ModelConfig.from_dir(folder)
    hf = AutoConfig.from_pretrained(folder)
    assert ours.architecture == hf.architectures[0]
    hf_head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    assert ours.head_dim == hf_head_dim
    assert ours.num_key_value_heads == hf.num_key_value_heads
    assert ours.rope_theta == hf.rope_parameters["rope_theta"]
    if hf.rope_parameters["rope_type"] == "default":
        assert ours.rope_scaling is None
    else:
        expected = {k: v for k, v in hf.rope_parameters.items() if k != "rope_theta"}
        assert ours.rope_scaling == expected
    assert ours.tie_word_embeddings == hf.tie_word_embeddings
    assert ours.sliding_window == getattr(hf, "sliding_window", None)
    assert ours.eos_token_ids == tuple(hf.eos_token_id)
    assert ours.bos_token_id == hf.bos_token_id
    assert ours.dtype == "float32"
    assert (
        ours.model_id.startswith(folder.name + "-") and len(ours.model_id) == len(folder.name) + 17
    )


def test_arch_specific_fields(tiny_model_dir) -> None:
    llama = ModelConfig.from_dir(tiny_model_dir("llama"))
    assert llama.rope_scaling is not None and llama.rope_scaling["rope_type"] == "llama3"
    assert not llama.attention_bias and not llama.qk_norm and not llama.tie_word_embeddings
    qwen2 = ModelConfig.from_dir(tiny_model_dir("qwen2"))
    assert qwen2.attention_bias and not qwen2.o_proj_bias and qwen2.tie_word_embeddings
    assert qwen2.sliding_window is None  # configured but use_sliding_window is false
    qwen3 = ModelConfig.from_dir(tiny_model_dir("qwen3"))
    assert qwen3.qk_norm and not qwen3.attention_bias
    assert qwen3.head_dim == 32 and qwen3.head_dim * qwen3.num_attention_heads != 64


def test_rope_parameters_spelling_equals_legacy_spelling(tmp_path: Path) -> None:
    rope = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    legacy = parse(
        tmp_path / "a",
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", **rope, "original_max_position_embeddings": 512},
    )
    v5 = parse(
        tmp_path / "b",
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            **rope,
            "original_max_position_embeddings": 512,
        },
    )
    assert (legacy.rope_theta, legacy.rope_scaling) == (v5.rope_theta, v5.rope_scaling)
    assert v5.rope_scaling == {
        "rope_type": "llama3",
        **rope,
        "original_max_position_embeddings": 512,
    }


def test_rope_parameters_read_like_transformers(tmp_path: Path) -> None:
    from transformers import AutoConfig

    cases = [
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1234.0}},
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 99.0},
        {"rope_scaling": {"type": "linear", "factor": 4.0}, "rope_theta": 5e5},
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
            }
        },  # original_max_position defaulted
        {},  # nothing: default theta
    ]
    for i, extra in enumerate(cases):
        folder = write_config(tmp_path / str(i), {**BASE, **extra})
        ours = ModelConfig.from_dir(folder)
        hf = AutoConfig.from_pretrained(folder).rope_parameters
        assert ours.rope_theta == hf["rope_theta"], extra
        if hf["rope_type"] == "default":
            assert ours.rope_scaling is None
        else:
            # We drop the legacy "type" alias that transformers keeps next to "rope_type".
            assert ours.rope_scaling == {
                k: v for k, v in hf.items() if k not in ("rope_theta", "type")
            }


def test_head_dim_dtype_and_token_ids(tmp_path: Path) -> None:
    cfg = parse(tmp_path / "a", head_dim=32, dtype="bfloat16", torch_dtype="float16")
    assert cfg.head_dim == 32 and cfg.dtype == "bfloat16"  # "dtype" wins, as in transformers
    assert parse(tmp_path / "b", torch_dtype="float16").dtype == "float16"
    assert parse(tmp_path / "c").head_dim == 16
    cfg = parse(tmp_path / "d", generation={"eos_token_id": [7, 2]}, eos_token_id=[2, 3])
    assert cfg.eos_token_ids == (2, 3, 7) and cfg.bos_token_id == 1


def test_model_id_follows_config_bytes(tmp_path: Path) -> None:
    a = parse(tmp_path / "a")
    assert a.model_id == ModelConfig.from_dir(a.model_dir).model_id
    b = parse(tmp_path / "b", vocab_size=1001)
    assert a.model_id.split("-")[-1] != b.model_id.split("-")[-1]


def test_qwen_sliding_window_layers(tmp_path: Path) -> None:
    cfg = parse(
        tmp_path,
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        use_sliding_window=True,
        sliding_window=128,
        max_window_layers=1,
    )
    assert cfg.sliding_window == 128
    assert cfg.layer_types == ("full_attention", "sliding_attention")
    mistral = parse(tmp_path / "m", architectures=["MistralForCausalLM"], sliding_window=64)
    assert mistral.sliding_window == 64 and set(mistral.layer_types) == {"sliding_attention"}


def test_missing_folder_and_file(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="does not exist"):
        ModelConfig.from_dir(tmp_path / "nope")
    with pytest.raises(ModelConfigError, match=r"config\.json: missing"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="not valid JSON"):
        ModelConfig.from_dir(tmp_path)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "architectures"),
        ({"architectures": None}, "architectures"),
        ({"hidden_size": None}, "hidden_size"),
        ({"hidden_size": 66}, "num_attention_heads"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"vocab_size": "big"}, "vocab_size"),
        ({"head_dim": 15}, "head_dim"),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "rope_scaling.rope_type"),
        ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
        ({"rope_theta": -1}, "rope_theta"),
        ({"torch_dtype": "float8"}, "torch_dtype"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"eos_token_id": "x"}, "eos_token_id"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ],
)
def test_bad_fields_are_named(tmp_path: Path, changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ModelConfigError) as err:
        parse(tmp_path, **changes)
    assert "config.json" in str(err.value) and field in str(err.value)


def test_copied_folder_keeps_identity_hash(tmp_path: Path, tiny_model_dir) -> None:
    src = tiny_model_dir("mistral")
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    assert ModelConfig.from_dir(dst).model_id == ModelConfig.from_dir(src).model_id
