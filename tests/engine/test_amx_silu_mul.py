"""The MLP's gate-up projection with SiLU-and-mul in the AMX GEMM's epilogue
(engine/cpu_kernels/bf16_amx.cpp): the same bits as the product followed by fused.cpp's
SiLU-and-mul, and the layer takes it only where the kernel takes the batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.device import cpu_fused_ops
from engine.layers import cpu_gemm
from engine.layers.activation import silu_and_mul
from engine.layers.linear import MergedColumnParallelLinear

pytestmark = pytest.mark.skipif(
    cpu_gemm._amx_kernel() is None, reason="this CPU has no AMX (the unfused path runs)"
)


def _unfused(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return cpu_fused_ops(x).silu_and_mul(cpu_gemm._amx_kernel().bf16_amx_linear(x, w, None))


@pytest.mark.parametrize("rows", [1, 3, 15, 16, 17, 33, 70, 288])
@pytest.mark.parametrize(("inter", "k"), [(16, 32), (48, 64), (2048, 768)])
def test_fused_gate_up_is_the_two_ops_bit_for_bit(rows: int, inter: int, k: int) -> None:
    """Every 16-row block and its tail, one or two blocks a pass, several passes a thread (the
    epilogue of one written during the next), gates far into both tails of the exp."""
    gen = torch.Generator().manual_seed(rows * 7 + inter + k)
    x = (torch.randn(rows, k, generator=gen) * 3).bfloat16()
    w = (torch.randn(2 * inter, k, generator=gen) * 0.5).bfloat16()
    got = cpu_gemm._amx_kernel().bf16_amx_silu_mul_linear(x, w)
    want = _unfused(x, w)
    assert got.shape == (rows, inter)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    gate, up = F.linear(x.float(), w.float()).chunk(2, dim=-1)
    torch.testing.assert_close(got.float(), F.silu(gate) * up, rtol=2**-6, atol=2e-2)


def test_fused_kernel_refuses_shapes_it_cannot_tile() -> None:
    kernel = cpu_gemm._amx_kernel()
    with pytest.raises(RuntimeError, match="K a multiple of 32"):
        kernel.bf16_amx_silu_mul_linear(
            torch.randn(8, 40).bfloat16(), torch.randn(32, 40).bfloat16()
        )
    with pytest.raises(RuntimeError, match="rows of 32"):
        kernel.bf16_amx_silu_mul_linear(
            torch.randn(8, 32).bfloat16(), torch.randn(48, 32).bfloat16()
        )
    with pytest.raises(RuntimeError, match="bfloat16"):
        kernel.bf16_amx_silu_mul_linear(torch.randn(8, 32), torch.randn(32, 32))


class _Spy:
    """The AMX module with its fused entry point counted."""

    def __init__(self, kernel: object) -> None:
        self.kernel, self.fused_calls = kernel, 0

    def bf16_amx_silu_mul_linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        self.fused_calls += 1
        return self.kernel.bf16_amx_silu_mul_linear(x, w)

    def __getattr__(self, name: str) -> object:
        return getattr(self.kernel, name)


def test_merged_projection_fuses_only_where_the_kernel_takes_the_batch(monkeypatch) -> None:
    layer = MergedColumnParallelLinear(64, [48, 48], False, dtype=torch.bfloat16)
    layer.weight.data = (torch.randn(96, 64) * 0.5).bfloat16()
    layer.use_cpu_gemm = True
    spy = _Spy(cpu_gemm._amx_kernel())
    monkeypatch.setattr(cpu_gemm, "_amx_kernel", lambda: spy)
    low, high = cpu_gemm.BF16_AMX_MIN_ROWS, cpu_gemm.BF16_AMX_MAX_ROWS
    for rows, fused in ((1, False), (low, True), (100, True), (high, True), (high + 9, False)):
        x = torch.randn(2, rows, 64).bfloat16()[0]  # a [rows, 64] view: reshaped, not copied
        before = spy.fused_calls
        got = layer.silu_and_mul(x)
        assert spy.fused_calls - before == int(fused), rows
        assert torch.equal(got, silu_and_mul(layer(x))), rows
    layer.weight.data = layer.weight.data.float()  # float32 layers keep the two ops
    before = spy.fused_calls
    layer.silu_and_mul(torch.randn(16, 64))
    assert spy.fused_calls == before
