"""The skinny CPU GEMM (engine/cpu_kernels/skinny_gemm.cpp) and its dispatch against F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.layers import cpu_gemm

pytestmark = pytest.mark.skipif(
    cpu_gemm._kernel() is None, reason="no C++ toolchain or no AVX2 for the kernel"
)


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 16, 17, 64, 192])
@pytest.mark.parametrize(("n", "k"), [(1, 8), (2, 64), (3, 16), (7, 776), (130, 256)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_f_linear(rows: int, n: int, k: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + n + k)
    x = torch.randn(rows, k, generator=gen)
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    got = cpu_gemm._kernel().skinny_linear(x, w, b)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_dispatch_keeps_shapes_and_falls_back() -> None:
    w = torch.randn(12, 40)
    for x in (torch.randn(2, 3, 40), torch.randn(cpu_gemm.skinny_max_rows() + 1, 40)):
        torch.testing.assert_close(cpu_gemm.linear(x, w, None), F.linear(x, w))
    odd = torch.randn(12, 41)  # K not a multiple of 8: plain torch
    x = torch.randn(3, 41)
    torch.testing.assert_close(cpu_gemm.linear(x, odd, None), F.linear(x, odd))
    strided = torch.randn(40, 4)[:, 1]  # a non-contiguous row
    torch.testing.assert_close(cpu_gemm.linear(strided, w, None), F.linear(strided, w))


def test_bad_arguments_are_clear_errors() -> None:
    kernel = cpu_gemm._kernel()
    with pytest.raises(RuntimeError, match="K must be a multiple of 8"):
        kernel.skinny_linear(torch.randn(2, 12), torch.randn(3, 12), None)
    with pytest.raises(RuntimeError, match="float32"):
        kernel.skinny_linear(torch.randn(2, 8).double(), torch.randn(3, 8).double(), None)
