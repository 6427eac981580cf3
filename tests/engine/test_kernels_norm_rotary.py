"""Fused residual-add RMSNorm, rotary (default and llama3 frequencies, both pair layouts),
SiLU-and-multiply and reshape-and-cache (Triton, under the interpreter) against their torch
references."""

from __future__ import annotations

import os

# Read when `@triton.jit` runs: set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from engine.kernels.reshape_and_cache import reshape_and_cache, reshape_and_cache_ref
from engine.kernels.rms_norm import rms_norm, rms_norm_ref
from engine.kernels.rotary import apply_rotary, apply_rotary_ref
from engine.kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from tests.engine.test_kernels_common import TOLERANCE
from tests.support.paged_kv import poisoned

LLAMA3 = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}  # fmt: skip
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden,fused", [(1, 64, True), (7, 80, False), (5, 96, True)])
def test_rms_norm(rows: int, hidden: int, fused: bool, dtype: torch.dtype) -> None:
    x = torch.randn(rows, hidden).to(dtype)
    residual = torch.randn(rows, hidden).to(dtype) if fused else None
    weight = torch.randn(hidden).to(dtype)
    out, new_residual = rms_norm(x, weight, 1e-6, residual)
    want, want_residual = rms_norm_ref(x, weight, 1e-6, residual)
    torch.testing.assert_close(out, want, **TOLERANCE[dtype])
    torch.testing.assert_close(new_residual, want_residual, **TOLERANCE[dtype])


def test_rms_norm_reference_is_the_model_layer(monkeypatch) -> None:
    # The layer's torch path, bit for bit; on CPU the layer would take the fused C++ kernel,
    # which tests/engine/test_cpu_fused.py holds to a tolerance instead.
    monkeypatch.setenv("BATON_CPU_FUSED", "0")
    layer = RMSNorm(64, 1e-5)
    layer.weight.data.normal_()
    x, residual = torch.randn(3, 64), torch.randn(3, 64)
    got = rms_norm_ref(x, layer.weight.data, 1e-5, residual)
    want = layer(x, residual)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "hq,hk,dim,scaling,neox",
    [(4, 2, 64, None, True), (2, 1, 128, LLAMA3, True), (3, 3, 80, None, False)],
)
def test_rotary(hq: int, hk: int, dim: int, scaling, neox: bool, dtype: torch.dtype) -> None:
    rope = RotaryEmbedding(dim, 256, 10000.0, scaling, dtype)
    positions = torch.tensor([0, 1, 63, 64, 200])
    # q and k as strided views of one fused projection, as the attention layer has them.
    qkv = torch.randn(5, (hq + 2 * hk) * dim).to(dtype)
    q = qkv[:, : hq * dim].view(5, hq, dim)
    k = qkv[:, hq * dim : (hq + hk) * dim].view(5, hk, dim)
    want_q, want_k = apply_rotary_ref(positions, q, k, rope.cos, rope.sin, neox)
    untouched = qkv[:, (hq + hk) * dim :].clone()
    if neox and dtype == torch.float32:  # the reference rotates as the model layer does
        layer_q, layer_k = rope(positions, q, k)
        torch.testing.assert_close(layer_q, want_q, **TOLERANCE[dtype])
        torch.testing.assert_close(layer_k, want_k, **TOLERANCE[dtype])
    got_q, got_k = apply_rotary(positions, q, k, rope.cos, rope.sin, neox)
    torch.testing.assert_close(got_q, want_q, **TOLERANCE[dtype])
    torch.testing.assert_close(got_k, want_k, **TOLERANCE[dtype])
    assert torch.equal(qkv[:, (hq + hk) * dim :], untouched), "v was written"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hk,dim,page", [(2, 64, 16), (1, 96, 32), (4, 256, 16)])
def test_reshape_and_cache(hk: int, dim: int, page: int, dtype: torch.dtype) -> None:
    num_tokens = 6
    kv = poisoned((5, 2, page, hk, dim), dtype)
    want = kv.clone()
    # Scattered slots incl. both ends of a block; one padding token (block -1) is skipped.
    blocks = torch.tensor([3, 0, 4, -1, 1, 3], dtype=torch.int32)
    offsets = torch.tensor([0, page - 1, 5, 2, 7, page - 1], dtype=torch.int32)
    k = torch.randn(num_tokens, hk, dim).to(dtype)
    v = torch.randn(num_tokens, 2 * hk, dim).to(dtype)[:, :hk]  # a strided view
    reshape_and_cache(k, v, kv, blocks, offsets)
    reshape_and_cache_ref(k, v, want, blocks, offsets)
    torch.testing.assert_close(kv, want, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,intermediate", [(1, 64), (5, 1100), (3, 7)])
def test_silu_and_mul(rows: int, intermediate: int, dtype: torch.dtype) -> None:
    gate_up = (4 * torch.randn(rows, 2 * intermediate)).to(dtype)
    out = silu_and_mul(gate_up)
    assert out.shape == (rows, intermediate)
    torch.testing.assert_close(out, silu_and_mul_ref(gate_up), **TOLERANCE[dtype])


def test_silu_and_mul_refuses_an_odd_width() -> None:
    with pytest.raises(ValueError, match="gate_up's last dimension must be even"):
        silu_and_mul(torch.zeros(2, 5))
