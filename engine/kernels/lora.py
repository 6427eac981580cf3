"""The segmented LoRA matmul: every row of a step under its own adapter, in one launch per
half (Punica's shrink and expand, S-LoRA's batching):

    shrink   v[t, :] = x[t, :] @ a[slot[t]]            a [slots, K, W]     v [T, W]
    expand   y[t, :] += v[t, :] @ b[slot[t]]           b [slots, W, N]     y [T, N]

A row whose slot is -1 (the base model) is skipped. W is the slots' stacked rank (every
projection fused in the layer, each padded to the engine's max rank: engine/lora/weights.py),
so one pair of launches serves the q, k and v deltas at once. Accumulation in float32, the
result rounded once into y's dtype. One program per row (and per block of N outputs in
the expand): a decode step's rows each read their adapter's A and B once, which is the
whole cost at decode sizes; a prompt's rows read them again per row (from L2: an adapter's
A and B are a few hundred KB per layer).

`add_lora` in engine/lora/weights.py is the reference, and the CPU path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels._checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check,
    check_shape,
    check_tensor,
    next_pow2,
)


@triton.jit
def _shrink_kernel(
    x_ptr, a_ptr, slot_ptr, v_ptr,
    K, W,
    stride_x, stride_as, stride_ak, stride_v,
    BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot < 0:
        return
    w = tl.arange(0, BLOCK_W)
    acc = tl.zeros([BLOCK_W], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        xk = tl.load(x_ptr + row * stride_x + k, mask=k < K, other=0.0).to(tl.float32)
        a = tl.load(
            a_ptr + slot * stride_as + k[:, None] * stride_ak + w[None, :],
            mask=(k[:, None] < K) & (w[None, :] < W),
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(a * xk[:, None], 0)
    tl.store(v_ptr + row * stride_v + w, acc, mask=w < W)


@triton.jit
def _expand_kernel(
    v_ptr, b_ptr, slot_ptr, y_ptr,
    N, W,
    stride_v, stride_bs, stride_bw, stride_y,
    BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot < 0:
        return
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w = tl.arange(0, BLOCK_W)
    v = tl.load(v_ptr + row * stride_v + w, mask=w < W, other=0.0)
    b = tl.load(
        b_ptr + slot * stride_bs + w[:, None] * stride_bw + n[None, :],
        mask=(w[:, None] < W) & (n[None, :] < N),
        other=0.0,
    ).to(tl.float32)
    delta = tl.sum(b * v[:, None], 0)
    y_at = y_ptr + row * stride_y + n
    y = tl.load(y_at, mask=n < N, other=0.0).to(tl.float32)
    tl.store(y_at, (y + delta).to(y_ptr.dtype.element_ty), mask=n < N)


def lora_add(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
             slots: torch.Tensor) -> None:  # fmt: skip
    """y[t] += (x[t] @ a[slots[t]]) @ b[slots[t]] for every row t with slots[t] >= 0."""
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check_tensor("a", a, 3, (x.dtype,), x.device)
    check_tensor("b", b, 3, (x.dtype,), x.device)
    check_tensor("y", y, 2, FLOAT_DTYPES, x.device)
    check_tensor("slots", slots, 1, INDEX_DTYPES, x.device)
    rows, k = x.shape
    num_slots, _, w = a.shape
    n = b.shape[2]
    check_shape("a", a, (num_slots, k, w))
    check_shape("b", b, (num_slots, w, n))
    check_shape("y", y, (rows, n))
    check_shape("slots", slots, (rows,))
    check(a.is_contiguous() and b.is_contiguous(), "a and b must be contiguous")
    if rows == 0:
        return
    v = torch.empty(rows, w, dtype=torch.float32, device=x.device)
    block_w = next_pow2(w)
    block_k = max(16, min(128, 8192 // block_w))
    _shrink_kernel[(rows,)](
        x, a, slots, v, k, w, x.stride(0), a.stride(0), a.stride(1), v.stride(0),
        BLOCK_W=block_w, BLOCK_K=block_k,
    )  # fmt: skip
    block_n = max(16, min(128, 8192 // block_w))
    _expand_kernel[(rows, triton.cdiv(n, block_n))](
        v, b, slots, y, n, w, v.stride(0), b.stride(0), b.stride(1), y.stride(0),
        BLOCK_W=block_w, BLOCK_N=block_n,
    )  # fmt: skip
