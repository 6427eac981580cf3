"""INT8 weight-only linear layer for GPUs (per-output-channel scales):

    y[m, n] = (sum_k x[m, k] * wq[n, k]) * scale[n] + bias[n]

Each program computes a BLOCK_M x BLOCK_N tile of y: it streams K in BLOCK_K steps, widens
the int8 weight tile to the activation dtype in registers (the bytes read from memory are
the int8 ones: a half of bf16's, which is the point at decode sizes) and accumulates
`tl.dot` in float32; the scale is applied once per output column after the loop, and the
result is rounded to the activation dtype once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels._checks import FLOAT_DTYPES, check, check_shape, check_tensor


@triton.jit
def _int8_linear_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, y_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    dtype = y_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        x = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * stride_xm + k[None, :],
            mask=(rows[:, None] < M) & (k[None, :] < K),
            other=0.0,
        )
        w = tl.load(
            w_ptr + cols[None, :].to(tl.int64) * stride_wn + k[:, None],
            mask=(cols[None, :] < N) & (k[:, None] < K),
            other=0,
        )
        acc += tl.dot(x.to(dtype), w.to(dtype), input_precision=PRECISION, out_dtype=tl.float32)
    scale = tl.load(scale_ptr + cols, mask=cols < N, other=0.0)
    acc = acc * scale[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(
        y_ptr + rows[:, None].to(tl.int64) * stride_ym + cols[None, :],
        acc.to(dtype),
        mask=(rows[:, None] < M) & (cols[None, :] < N),
    )


def _block_m(rows: int) -> int:
    # tl.dot needs at least 16 rows; a decode batch of a few rows still pays for 16.
    return 16 if rows <= 16 else (32 if rows <= 32 else 64)


def int8_linear(
    x: torch.Tensor, wq: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [M, K] (float), wq [N, K] int8, scale [N] float32, bias [N] (x's dtype) -> [M, N]."""
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check_tensor("wq", wq, 2, (torch.int8,), x.device)
    check_tensor("scale", scale, 1, (torch.float32,), x.device)
    rows, k = x.shape
    n = wq.shape[0]
    check_shape("wq", wq, (n, k))
    check_shape("scale", scale, (n,))
    if bias is not None:
        check_tensor("bias", bias, 1, FLOAT_DTYPES, x.device)
        check_shape("bias", bias, (n,))
    check(k % 16 == 0, f"in_features must be a multiple of 16, got {k}")
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0:
        return y
    block_m, block_n, block_k = _block_m(rows), 64, 64
    grid = (triton.cdiv(rows, block_m), triton.cdiv(n, block_n))
    _int8_linear_kernel[grid](
        x, wq, scale, bias if bias is not None else scale, y,
        rows, n, k,
        x.stride(0), wq.stride(0), y.stride(0),
        HAS_BIAS=bias is not None,
        # float32 activations: full-precision products, not TF32 (the layer's answer should
        # not depend on the GPU generation); half types are exact in any mode.
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip
    return y


def int8_linear_ref(
    x: torch.Tensor, wq: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    y = (x.float() @ wq.float().t()) * scale
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
