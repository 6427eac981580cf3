"""The tiny models' random weights (HF names and shapes) and their safetensors files."""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

# Scales chosen by measuring greedy decoding with transformers on 20 prompts x 48 tokens per
# arch: unit-RMS embeddings, fan-in scaled projections, and an output head whose logits
# spread with std ~LOGIT_STD, so top-1/top-2 gaps sit far above fp32 noise (median ~0.8,
# 1st percentile ~0.01). A tied head can't be both a unit-RMS input and a wide output: its
# input side then favours repeating the current token (greedy collapsed into one token for
# 17/20 prompts), so tied models get a small embedding and a final norm that restores the
# logit spread (collapse then 1-2/20).
EMBED_STD = 1.0
PROJ_GAIN = 1.0
LOGIT_STD = 4.0
NORM_JITTER = 0.05
BIAS_STD = 0.1
QUIET_ROW_SCALE = 0.01
TIED_EMBED_STD = 0.05


def parameter_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF parameter names and shapes for a config dict, in checkpoint order."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    inter = config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // heads
    is_qwen2 = config["model_type"] == "qwen2"
    qkv_bias = is_qwen2 or config.get("attention_bias", False)
    o_bias = config.get("attention_bias", False) and not is_qwen2
    mlp_bias = config.get("mlp_bias", False)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        for proj, rows in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
            shapes[p + f"self_attn.{proj}_proj.weight"] = (rows * head_dim, hidden)
            if qkv_bias:
                shapes[p + f"self_attn.{proj}_proj.bias"] = (rows * head_dim,)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, heads * head_dim)
        if o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (hidden,)
        if config["model_type"] == "qwen3":
            shapes[p + "self_attn.q_norm.weight"] = (head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (head_dim,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        for proj, shape in (
            ("gate", (inter, hidden)),
            ("up", (inter, hidden)),
            ("down", (hidden, inter)),
        ):
            shapes[p + f"mlp.{proj}_proj.weight"] = shape
            if mlp_bias:
                shapes[p + f"mlp.{proj}_proj.bias"] = shape[:1]
    shapes["model.norm.weight"] = (hidden,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def draw_weights(
    config: dict[str, Any],
    seed: int,
    quiet_token_ids: list[int] | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """fp32 random weights, drawn on `device` (a GPU draws an 8B model's in seconds; each
    device draws its own values). Each tensor has its own generator seeded by (seed, name),
    so a tensor doesn't change when unrelated options (layer count, biases) do.

    `quiet_token_ids` get output rows near zero, so greedy decoding practically never picks
    them (as with the untrained reserved tokens of real Llama 3 checkpoints): reserved
    padding and control tokens would otherwise fill demo output with invisible text.
    """
    hidden = config["hidden_size"]
    tied = config["tie_word_embeddings"]
    weights: dict[str, torch.Tensor] = {}
    for name, shape in parameter_shapes(config).items():
        gen = torch.Generator(device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        noise = torch.randn(shape, generator=gen, dtype=torch.float32, device=device)
        if name == "model.norm.weight" and tied:
            # The tied head is small (see TIED_EMBED_STD): the final norm restores the spread.
            gain = LOGIT_STD / (TIED_EMBED_STD * math.sqrt(hidden))
            weights[name] = gain * (1.0 + NORM_JITTER * noise)
        elif name.endswith("norm.weight"):
            weights[name] = 1.0 + NORM_JITTER * noise
        elif name.endswith(".bias"):
            weights[name] = BIAS_STD * noise
        elif name == "lm_head.weight":
            weights[name] = (LOGIT_STD / math.sqrt(hidden)) * noise
        elif tied and name == "model.embed_tokens.weight":
            weights[name] = TIED_EMBED_STD * noise
        elif name == "model.embed_tokens.weight":
            weights[name] = EMBED_STD * noise
        else:
            weights[name] = (PROJ_GAIN / math.sqrt(shape[1])) * noise
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    if quiet_token_ids:
        weights[head][torch.tensor(quiet_token_ids)] *= QUIET_ROW_SCALE
    return weights


def write_safetensors(
    out: Path, weights: dict[str, torch.Tensor], dtype: str, shards: int = 1
) -> list[Path]:
    """model.safetensors, or `shards` files of about equal size plus the HF index."""
    torch_dtype = getattr(torch, dtype)
    tensors = {name: t.to(torch_dtype).contiguous().cpu() for name, t in weights.items()}
    metadata = {"format": "pt"}
    if shards <= 1:
        path = out / "model.safetensors"
        save_file(tensors, str(path), metadata=metadata)
        return [path]
    if shards > len(tensors):
        raise ValueError(f"cannot split {len(tensors)} tensors into {shards} shards")
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    groups: list[dict[str, torch.Tensor]] = [{} for _ in range(shards)]
    done, names = 0, list(tensors)
    for pos, name in enumerate(names):
        # Fill shards in order by cumulative size, leaving at least one tensor per shard.
        shard = min(int(done * shards / total), shards - 1, pos)
        shard = max(shard, shards - (len(names) - pos))
        groups[shard][name] = tensors[name]
        done += tensors[name].numel() * tensors[name].element_size()
    files, weight_map = [], {}
    for k, group in enumerate(groups, start=1):
        path = out / f"model-{k:05d}-of-{shards:05d}.safetensors"
        save_file(group, str(path), metadata=metadata)
        files.append(path)
        weight_map.update({name: path.name for name in group})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    write_json(out / "model.safetensors.index.json", index)
    return files


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Indented and ending in a newline, as Hugging Face writes its folders' JSON files."""
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
