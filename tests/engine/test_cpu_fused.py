"""The fused CPU elementwise kernels (engine/cpu_kernels/fused.cpp) against plain torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import cpu_kernels
from engine.layers.activation import silu_and_mul
from engine.layers.norm import RMSNorm

ops = cpu_kernels.load("fused")
pytestmark = pytest.mark.skipif(ops is None, reason="no C++ toolchain for the kernels")


def hf_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("rows", [1, 7, 16, 300])
@pytest.mark.parametrize("cols", [1, 13, 768])
def test_silu_and_mul(rows: int, cols: int) -> None:
    x = torch.randn(rows, 2 * cols) * 8  # exp reaches far into both tails
    ref = F.silu(x[:, :cols]) * x[:, cols:]
    torch.testing.assert_close(ops.silu_and_mul(x), ref, rtol=1e-6, atol=1e-6)


def test_silu_extremes_stay_finite() -> None:
    g = torch.tensor([[-1e4, -100.0, -88.5, 0.0, 88.5, 100.0, 1e4]])
    x = torch.cat([g, torch.ones_like(g)], dim=1)
    torch.testing.assert_close(ops.silu_and_mul(x), F.silu(g), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("rows", [1, 5, 16, 300])
@pytest.mark.parametrize("cols", [8, 129, 768])
def test_rms_norm_and_residual_add(rows: int, cols: int) -> None:
    x, res, w = torch.randn(rows, cols), torch.randn(rows, cols), torch.randn(cols)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5), hf_rms_norm(x, w, 1e-5))
    out, summed = ops.add_rms_norm(x, res, w, 1e-5)
    torch.testing.assert_close(summed, x + res, rtol=0, atol=0)
    torch.testing.assert_close(out, hf_rms_norm(x + res, w, 1e-5))


def test_layers_use_them_and_agree_with_the_torch_path(monkeypatch) -> None:
    monkeypatch.setenv("BATON_CPU_FUSED", "1")
    x, res = torch.randn(9, 64), torch.randn(9, 64)
    norm = RMSNorm(64, 1e-6)
    norm.weight.data = torch.randn(64)
    fused = norm(x, res), silu_and_mul(torch.cat([x, res], 1))
    monkeypatch.setenv("BATON_CPU_FUSED", "0")
    plain = norm(x, res), silu_and_mul(torch.cat([x, res], 1))
    torch.testing.assert_close(fused[0][0], plain[0][0])
    torch.testing.assert_close(fused[0][1], plain[0][1])
    torch.testing.assert_close(fused[1], plain[1])


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(RuntimeError, match="even number of columns"):
        ops.silu_and_mul(torch.randn(2, 3))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        ops.rms_norm(torch.randn(2, 4, dtype=torch.float64), torch.ones(4), 1e-6)
    with pytest.raises(RuntimeError, match="mixed"):
        ops.rms_norm(torch.randn(2, 4).bfloat16(), torch.ones(4), 1e-6)
    with pytest.raises(RuntimeError, match="weight shape"):
        ops.rms_norm(torch.randn(2, 4), torch.ones(5), 1e-6)


@pytest.mark.parametrize(("tokens", "head_dim"), [(1, 64), (5, 16), (300, 128)])
def test_rotary_matches_the_torch_path_on_strided_qkv_slices(
    tokens: int, head_dim: int, monkeypatch
) -> None:
    from engine.layers.rotary import RotaryEmbedding, _rotate

    monkeypatch.setenv("BATON_CPU_FUSED", "1")
    rope = RotaryEmbedding(head_dim, 4096, 10000.0, None, torch.float32)
    hq, hk = 6, 2
    qkv = torch.randn(tokens, (hq + 2 * hk) * head_dim)  # q and k are strided views of it
    q = qkv[:, : hq * head_dim].view(tokens, hq, head_dim)
    k = qkv[:, hq * head_dim : (hq + hk) * head_dim].view(tokens, hk, head_dim)
    positions = torch.randint(0, 4096, (tokens,))
    q_out, k_out = ops.rotary(positions, q, k, rope.cos, rope.sin)
    cos, sin = rope.cos[positions].unsqueeze(1), rope.sin[positions].unsqueeze(1)
    torch.testing.assert_close(q_out, _rotate(q, cos, sin))
    torch.testing.assert_close(k_out, _rotate(k, cos, sin))
    got = rope(positions, q, k)  # the layer takes the fused path
    torch.testing.assert_close(got[0], q_out, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="outside the table"):
        ops.rotary(torch.full((tokens,), 5000), q, k, rope.cos, rope.sin)


def _same_as_the_torch_ops(fused: torch.Tensor, plain: torch.Tensor) -> None:
    """bfloat16: rounded where torch's ops round, so equal but where a float32 sum or exp
    computed in another order lands across a rounding boundary: one bf16 step apart, two
    where the norm's step then goes through the product with the weight and its rounding."""
    assert fused.dtype == plain.dtype == torch.bfloat16
    steps = fused.view(torch.int16).int() - plain.view(torch.int16).int()  # same signs here
    assert steps.abs().max() <= 2
    assert (steps == 0).float().mean() > 0.99


@pytest.mark.parametrize("rows", [1, 16, 300])
def test_bfloat16_layers_round_where_the_torch_ops_do(rows: int, monkeypatch) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 768, generator=gen) * 4).bfloat16()
    res = torch.randn(rows, 768, generator=gen).bfloat16()
    norm = RMSNorm(768, 1e-5, dtype=torch.bfloat16)
    norm.weight.data = torch.randn(768, generator=gen).bfloat16()
    gate_up = (torch.randn(rows, 2 * 512, generator=gen) * 6).bfloat16()
    monkeypatch.setenv("BATON_CPU_FUSED", "1")
    fused = [*norm(x, res), norm(x)[0], silu_and_mul(gate_up)]
    monkeypatch.setenv("BATON_CPU_FUSED", "0")
    plain = [*norm(x, res), norm(x)[0], silu_and_mul(gate_up)]
    assert torch.equal(fused[1], plain[1])  # the residual sum: one rounding either way
    for got, want in zip(fused, plain, strict=True):
        _same_as_the_torch_ops(got, want)


def test_bfloat16_rotary_is_the_torch_path_bit_for_bit() -> None:
    """No sums or exps to reorder: each product and the sum rounded as torch rounds them."""
    from engine.layers.rotary import RotaryEmbedding, _rotate

    rope = RotaryEmbedding(64, 4096, 500000.0, None, torch.bfloat16)
    qkv = torch.randn(37, 8 * 64).bfloat16()
    q, k = qkv[:, : 6 * 64].view(37, 6, 64), qkv[:, 6 * 64 :].view(37, 2, 64)
    positions = torch.randint(0, 4096, (37,))
    q_out, k_out = ops.rotary(positions, q, k, rope.cos, rope.sin)
    cos, sin = rope.cos[positions].unsqueeze(1), rope.sin[positions].unsqueeze(1)
    assert torch.equal(q_out, _rotate(q, cos, sin)) and torch.equal(k_out, _rotate(k, cos, sin))
    assert torch.equal(rope(positions, q, k)[0], q_out)  # the layer takes the fused path
