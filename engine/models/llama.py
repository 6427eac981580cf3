"""The Llama family: Llama 2/3/3.x, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm).

They differ only in flags read from the config, so one definition serves all four. Parameter
names follow Hugging Face's; q/k/v and gate/up are fused into single GEMMs and the mapping
below routes each checkpoint tensor to its slice.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.config import ModelConfig
from engine.layers.attention import SelfAttention
from engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from engine.layers.linear import (
    MergedColumnParallelLinear,
    RowParallelLinear,
    default_weight_loader,
)
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.parallel import SINGLE, TPGroup

# checkpoint name fragment -> (fused parameter fragment, shard id)
_FUSED = {
    ".q_proj.": (".qkv_proj.", "q"),
    ".k_proj.": (".qkv_proj.", "k"),
    ".v_proj.": (".qkv_proj.", "v"),
    ".gate_proj.": (".gate_up_proj.", 0),
    ".up_proj.": (".gate_up_proj.", 1),
}


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, tp: TPGroup, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate] * 2, False, tp, dtype)
        self.down_proj = RowParallelLinear(intermediate, hidden, False, tp, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj.silu_and_mul(x))


class DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
        tp: TPGroup,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.self_attn = SelfAttention(
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            qkv_bias=cfg.attention_bias,
            qk_norm_eps=cfg.rms_norm_eps if cfg.qk_norm else None,
            rotary=rotary,
            backend=backend,
            tp=tp,
            dtype=dtype,
        )
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, tp, dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_layer: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_layer, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(
        self, cfg: ModelConfig, backend: AttentionBackend, tp: TPGroup, dtype: torch.dtype
    ):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp, dtype)
        rotary = RotaryEmbedding(
            cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling, dtype
        )
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, rotary, backend, tp, dtype) for _ in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for i, layer in enumerate(self.layers):
            hidden, residual = layer(positions, hidden, residual, kv_cache[i], meta)
            if meta.layer_done is not None:
                meta.layer_done(i)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        backend: AttentionBackend,
        tp: TPGroup = SINGLE,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, backend, tp, dtype)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp, dtype)
        if cfg.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)

    def forward(self, *args: Any) -> torch.Tensor:
        """`LlamaModel.forward`'s arguments and result: the final hidden states (the model
        runner applies `lm_head` only to the rows it samples). This class exists so the
        parameter names match the checkpoint's (`model.*`, `lm_head.*`)."""
        return self.model(*args)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors into the (possibly fused, possibly sharded) parameters.

        Every parameter must be written exactly once per shard; a missing or unexpected
        tensor is an error naming it.
        """
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # some tied checkpoints still carry a copy
            target, shard = name, None
            for frag, (fused, shard_id) in _FUSED.items():
                if frag in name:
                    target, shard = name.replace(frag, fused), shard_id
                    break
            param = params.get(target)
            if param is None:
                raise ValueError(f"checkpoint tensor {name!r} matches no model parameter")
            loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                loader(param, tensor, shard) if shard is not None else loader(param, tensor)
            except ValueError as e:
                raise ValueError(f"while loading checkpoint tensor {name!r}: {e}") from e
            loaded.add(name)
        self._check_complete(loaded)

    def _check_complete(self, loaded: set[str]) -> None:
        expected: set[str] = set()
        for name, _ in self.named_parameters():
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            fused = next(((f, s) for s, (f, _) in _FUSED.items() if f in name), None)
            if fused is None:
                expected.add(name)
            else:
                frag = fused[0]
                parts = [s for s, (f, _) in _FUSED.items() if f == frag]
                expected.update(name.replace(frag, p) for p in parts)
        missing = sorted(expected - loaded)
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise ValueError(f"checkpoint is missing {len(missing)} tensor(s): {shown}")
