"""RMSNorm over the last dimension, optionally fused with the residual add before it:

    h = x + residual          (HAS_RESIDUAL; h is also returned as the new residual)
    y = weight * (h / sqrt(mean(h^2) + eps))

in Hugging Face's order: the sum in the activation dtype, the normalisation in float32, a
cast back, then the weight multiply in the activation dtype. One program per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels._checks import FLOAT_DTYPES, check, check_shape, check_tensor, next_pow2


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    eps,
    stride_x, stride_r, stride_o, stride_ro,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    # Arithmetic in float32, rounded to the activation dtype where Hugging Face rounds:
    # what a half-precision op does on the GPU anyway, and the interpreter's bfloat16
    # arithmetic is wrong (Triton 3.9).
    dtype = out_ptr.dtype.element_ty
    h = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        h = (h + r.to(tl.float32)).to(dtype).to(tl.float32)
        tl.store(residual_out_ptr + row * stride_ro + cols, h.to(dtype), mask=mask)
    inv_rms = 1.0 / tl.sqrt(tl.sum(h * h, 0) / HIDDEN + eps)
    normed = (h * inv_rms).to(dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (w * normed).to(dtype), mask=mask)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [N, H]; weight: [H]. Returns (normed, new residual); without `residual`
    the second value is `x` itself."""
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check_tensor("weight", weight, 1, (x.dtype,), x.device)
    rows, hidden = x.shape
    check_shape("weight", weight, (hidden,))
    check(eps > 0, f"eps must be positive, got {eps}")
    out = torch.empty_like(x)
    residual_out = x
    if residual is not None:
        check_tensor("residual", residual, 2, (x.dtype,), x.device)
        check_shape("residual", residual, x.shape)
        residual_out = torch.empty_like(x)
    if rows == 0:
        return out, residual_out
    r = residual if residual is not None else x
    _rms_norm_kernel[(rows,)](
        x, r, weight, out, residual_out,
        eps,
        x.stride(0), r.stride(0), out.stride(0), residual_out.stride(0),
        HIDDEN=hidden, BLOCK=next_pow2(hidden), HAS_RESIDUAL=residual is not None,
    )  # fmt: skip
    return out, residual_out


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    h = x if residual is None else x + residual
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * normed, h
