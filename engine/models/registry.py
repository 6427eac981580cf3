"""Architecture name (config.json "architectures") -> model class."""

from __future__ import annotations

import torch
from torch import nn

from engine.attention.backend import AttentionBackend
from engine.config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.parallel import SINGLE, TPGroup

_MODELS: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def build_model(
    cfg: ModelConfig,
    backend: AttentionBackend,
    dtype: torch.dtype,
    device: torch.device,
    tp: TPGroup = SINGLE,
) -> nn.Module:
    cls = _MODELS.get(cfg.architecture)
    if cls is None:
        raise ValueError(
            f"unsupported architecture {cfg.architecture!r} in {cfg.model_dir}/config.json; "
            f"supported: {', '.join(supported_architectures())}"
        )
    # Every parameter is made in `dtype` on `device` (the layers take the dtype), so no
    # float32 copy of the model exists on the way; the rotary tables are computed in float32
    # and cast, as Hugging Face does.
    with torch.device(device):
        return cls(cfg, backend, tp, dtype)
