"""INT8 checkpoints (engine/int8_checkpoint.py): `baton quantize` writes the quantized weights
in Hugging Face format, and the engine loads them as int8, with no float copy: the same
weights as quantizing on load, the oracle's tokens, at TP 1 and 2."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open

from core.config import EngineConfig
from core.sampling import SamplingParams
from engine.config import ModelConfig, ModelConfigError
from engine.int8_checkpoint import write_int8_checkpoint
from engine.llm import LLM
from router.cli.main import main as baton
from tests import oracle

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
PROMPTS = [[5, 9, 13, 200, 7], list(range(30, 130))]


def tensors_of(folder) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            out.update((name, f.get_tensor(name)) for name in f.keys())  # noqa: SIM118
    return out


@pytest.mark.parametrize(("arch", "shards"), [("llama", 1), ("qwen2", 2)])  # qwen2: tied
def test_quantize_writes_int8_weights_and_their_scales(
    tiny_model_dir, tmp_path, arch: str, shards: int
) -> None:
    src = tiny_model_dir(arch, shards=shards)
    dst = tmp_path / "int8"
    assert baton(["quantize", str(src), str(dst)]) == 0
    config = json.loads((dst / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "baton-int8"
    assert config["tie_word_embeddings"] is False
    assert ModelConfig.from_dir(dst).quantization == "int8"
    tensors = tensors_of(dst)
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj", "lm_head"):
        assert tensors[f"{name}.weight"].dtype == torch.int8
        assert tensors[f"{name}.weight_scale"].shape == (tensors[f"{name}.weight"].shape[0],)
    assert tensors["model.embed_tokens.weight"].dtype == torch.float32
    assert (dst / "model.safetensors.index.json").exists() == (shards > 1)
    assert (dst / "tokenizer.json").exists()
    assert baton(["quantize", str(src), str(dst)]) == 2  # not over a written one


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_an_int8_checkpoint_loads_the_weights_quantizing_on_load_makes(
    tiny_model_dir, tmp_path, arch: str
) -> None:
    src = tiny_model_dir(arch)
    dst = write_int8_checkpoint(src, tmp_path / "int8")
    loaded = LLM(dst, num_kv_blocks=64)
    on_load = LLM(src, quantization="int8", num_kv_blocks=64)
    mine = dict(loaded.engine.runner.model.named_parameters())
    theirs = {**dict(on_load.engine.runner.model.named_buffers()),
              **dict(on_load.engine.runner.model.named_parameters())}  # fmt: skip
    for name, tensor in mine.items():
        assert torch.equal(tensor, theirs[name]), name
    assert mine["model.layers.0.self_attn.qkv_proj.weight"].dtype == torch.int8
    reference = oracle.write_fake_quantized(str(src), str(tmp_path / "fake-int8"))
    for prompt, out in zip(PROMPTS, loaded.generate(PROMPTS, GREEDY), strict=True):
        assert list(out.token_ids) == oracle.hf_greedy(reference, tuple(prompt), 12)
    w8a8 = LLM(dst, quantization="w8a8", num_kv_blocks=64).engine.runner.model
    assert w8a8.model.layers[0].mlp.down_proj.int8_activations


def test_tp2_ranks_load_their_shards_of_an_int8_checkpoint(tiny_model_dir, tmp_path) -> None:
    from engine.tp import TPEngine

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    src = tiny_model_dir("llama")
    dst = write_int8_checkpoint(src, tmp_path / "int8")
    reference = oracle.write_fake_quantized(str(src), str(tmp_path / "fake-int8"))
    config = EngineConfig(tp_size=2, num_kv_blocks=64, num_threads=1)
    with TPEngine(dst, config) as engine:
        outs = engine.generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert list(out.token_ids) == oracle.hf_greedy(reference, tuple(prompt), 12)


def test_other_quantized_checkpoints_are_refused_by_name(tiny_model_dir, tmp_path) -> None:
    src = tiny_model_dir("llama")
    dst = write_int8_checkpoint(src, tmp_path / "int8")
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (dst / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match=r"quantization_config.*gptq"):
        ModelConfig.from_dir(dst)
    with pytest.raises(ValueError, match="already quantized"):
        write_int8_checkpoint(dst, tmp_path / "again")
