"""bfloat16 linears through float32 FMAs (engine/cpu_kernels/bf16_fma.cpp) and when
engine/layers/cpu_gemm.py sends them there."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import cpu_kernels
from engine.layers import cpu_gemm

KERNEL = cpu_kernels.load_available("bf16_fma")
pytestmark = pytest.mark.skipif(KERNEL is None, reason="no C++ toolchain or no AVX-512")


def _operands(rows: int, n: int, k: int, bias: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16() if bias else None
    return x, w, b


@pytest.mark.parametrize("rows", [1, 5, 6, 7, 13, 70])
@pytest.mark.parametrize(("n", "k"), [(1, 32), (4, 64), (5, 96), (130, 768)])
@pytest.mark.parametrize("bias", [False, True])
def test_sums_exact_bf16_products_in_float32(rows: int, n: int, k: int, bias: bool) -> None:
    """Every register tile's shape (6 rows of x and fewer, 4 weight rows and fewer) against
    float32 sums of the same products, rounded once."""
    x, w, b = _operands(rows, n, k, bias, rows * 1000 + n + k)
    got = KERNEL.bf16_fma_linear(x, w, b)
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-4)


def test_panels_and_threads_give_each_row_as_alone() -> None:
    """Past a panel's megabyte (252 rows at K = 1,024) x is taken panel by panel: 600 rows are
    panels of 252, 252 and 96, none a multiple of a tile's 6 rows at its end. Each output sums
    its products in one order whatever the panel, the tile or the thread, so every row comes
    out as the same rows alone give it, bit for bit, on 1 and 2 threads."""
    x, w, b = _operands(600, 70, 1024, True, 600)
    threads = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            whole = KERNEL.bf16_fma_linear(x, w, b)
            for begin, end in ((0, 7), (250, 260), (504, 600), (599, 600)):
                assert torch.equal(whole[begin:end], KERNEL.bf16_fma_linear(x[begin:end], w, b))
            outs.append(whole)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1])
    want = F.linear(x.float(), w.float(), b.float())
    torch.testing.assert_close(outs[0].float(), want, rtol=2**-8, atol=1e-3)


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(RuntimeError, match="K a multiple of 32"):
        KERNEL.bf16_fma_linear(torch.randn(2, 40).bfloat16(), torch.randn(3, 40).bfloat16(), None)
    with pytest.raises(RuntimeError, match="bfloat16"):
        KERNEL.bf16_fma_linear(torch.randn(2, 32), torch.randn(3, 32), None)
    with pytest.raises(RuntimeError, match="bias of N"):
        x, w, _ = _operands(2, 3, 32, False, 0)
        KERNEL.bf16_fma_linear(x, w, torch.zeros(4).bfloat16())


@pytest.mark.skipif(
    "avx512_bf16" not in cpu_kernels.cpu_flags(), reason="the probe needs AVX-512 BF16"
)
def test_the_probe_compares_the_two_instructions() -> None:
    ratio = KERNEL.dpbf16_over_fma()
    assert 0.05 < ratio < 20


def test_dispatch_follows_the_probe_and_the_switch(monkeypatch) -> None:
    """Without AMX, bf16 linears past the few-row kernel's rows go to bf16_fma exactly when
    the probe says its FMAs win (or the CPU has no AVX-512 BF16); BATON_BF16_FMA=0 keeps
    them on torch's linear."""
    w = torch.randn(64, 96).bfloat16()
    rows = cpu_gemm.bf16_gemv_max_rows() + 1
    cpu_gemm._fma_kernel.cache_clear()
    try:
        chosen = cpu_gemm._fma_kernel()
        if cpu_gemm._amx_kernel() is not None:
            assert chosen is None
        elif "avx512_bf16" not in cpu_kernels.cpu_flags():
            assert chosen is KERNEL
        else:
            ratio = KERNEL.dpbf16_over_fma()
            # the probe is run again here: only a clear verdict is checked
            if ratio < cpu_gemm.DPBF16_OVER_FMA_FOR_FMA * 0.8:
                assert chosen is KERNEL
            elif ratio > cpu_gemm.DPBF16_OVER_FMA_FOR_FMA * 1.25:
                assert chosen is None
        if chosen is not None:
            assert cpu_gemm.kernel_for(rows, w) == KERNEL.bf16_fma_linear
            assert cpu_gemm.kernel_for(4096, w) == KERNEL.bf16_fma_linear
            assert cpu_gemm.kernel_for(rows, torch.randn(64, 80).bfloat16()) is None
        monkeypatch.setenv("BATON_BF16_FMA", "0")
        cpu_gemm._fma_kernel.cache_clear()
        assert cpu_gemm._fma_kernel() is None
        if cpu_gemm._amx_kernel() is None:
            assert cpu_gemm.kernel_for(rows, w) is None
        x = torch.randn(3, rows, 96).bfloat16()
        torch.testing.assert_close(
            cpu_gemm.linear(x, w, None).float(),
            F.linear(x.float(), w.float()),
            rtol=2**-7,
            atol=1e-3,
        )
    finally:
        monkeypatch.delenv("BATON_BF16_FMA", raising=False)
        cpu_gemm._fma_kernel.cache_clear()
