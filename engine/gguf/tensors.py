"""A GGUF file's tensors under their Hugging Face names, dequantized to float32.

    token_embd                -> model.embed_tokens
    output_norm / output      -> model.norm / lm_head
    blk.N.attn_norm           -> model.layers.N.input_layernorm
    blk.N.ffn_norm            -> model.layers.N.post_attention_layernorm
    blk.N.attn_q / k / v      -> model.layers.N.self_attn.q_proj / k_proj / v_proj
    blk.N.attn_output         -> model.layers.N.self_attn.o_proj
    blk.N.attn_q_norm / k_norm -> model.layers.N.self_attn.q_norm / k_norm
    blk.N.ffn_gate / up / down -> model.layers.N.mlp.gate_proj / up_proj / down_proj

llama.cpp's converter stores a Llama's q and k projections with each head's rotary halves
interleaved (its rope pairs neighbours, Hugging Face's pairs the two halves); `_unpermute`
puts them back, per head:

    GGUF rows of a head:  [r0 r(d/2) r1 r(d/2+1) ...]   ->   HF rows: [r0 r1 ... | r(d/2) ...]
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor, quants

from engine.gguf.config import PERMUTED_QK, GGUFError

DEQUANTIZED = {
    GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1,
    GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K,
}  # fmt: skip
"""The types imported: each one's dequantization is checked against transformers' own in
the tests."""
_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(name: str) -> str:
    if name in _TOP:
        return _TOP[name]
    match = _BLOCK.fullmatch(name)
    if match is None or match[2] not in _LAYER:
        raise GGUFError(f"GGUF tensor {name!r} is not handled")
    return f"model.layers.{match[1]}.{_LAYER[match[2]]}.{match[3]}"


def dequantize(tensor: ReaderTensor) -> np.ndarray:
    if tensor.tensor_type not in DEQUANTIZED:
        raise GGUFError(
            f"GGUF tensor {tensor.name!r} has type {tensor.tensor_type.name}, which is not "
            f"handled (handled: {', '.join(sorted(t.name for t in DEQUANTIZED))})"
        )
    values = quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)  # owned
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # GGUF lists ne0 first
    return values.reshape(shape)


def _unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    half = weight.shape[0] // num_heads // 2
    return (
        weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def hf_tensors(reader: GGUFReader, arch: str, config: dict) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, float32 array) for every tensor of the file."""
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        values = dequantize(tensor)
        kind = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
        if arch in PERMUTED_QK and kind in heads and tensor.name.endswith(".weight"):
            values = _unpermute(values, heads[kind])
        yield name, values
