"""Rotary position embedding applied in place to q and k, from a cos/sin table.

The table `[max_position, head_dim]` holds cos/sin of `position * inv_freq` duplicated over
both halves (Hugging Face's layout); the frequency scaling (default, linear, llama3) lives
entirely in `inv_freq` (engine/layers/rotary.py), so one kernel serves all of them.

    NEOX (rotate half, Llama):  pairs (i, i + D/2)      GPT-J (interleaved):  pairs (2i, 2i+1)
    x'_a = x_a cos - x_b sin,   x'_b = x_b cos + x_a sin     (math in float32)
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
def _pair_offsets(HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, NEOX: tl.constexpr):
    """The offsets in a head of each rotated pair's two values, [BLOCK_HALF] each."""
    i = tl.arange(0, BLOCK_HALF)
    if NEOX:
        return i, i + HALF
    else:
        return 2 * i, 2 * i + 1


@triton.jit
def _cos_sin(cos_ptr, sin_ptr, positions_ptr, t, stride_table, HALF: tl.constexpr,
             BLOCK_HALF: tl.constexpr):  # fmt: skip
    """Token t's cos and sin, float32 [BLOCK_HALF]: both halves of a table row hold the same
    values, so the first is read."""
    pos = tl.load(positions_ptr + t).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cos_ptr + pos * stride_table + i, mask=i < HALF, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos * stride_table + i, mask=i < HALF, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def _rotate_heads(
    x_ptr, stride_t, stride_h, t, cos, sin,
    NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr, NEOX: tl.constexpr,
):  # fmt: skip
    """Rotates token t's heads in place. Returns the rotated pairs' two halves as stored
    (x's dtype, [BLOCK_H, BLOCK_HALF] each, 0 where masked) and their mask."""
    h = tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_HALF)
    mask = (h < NUM_HEADS)[:, None] & (i < HALF)[None, :]
    a_off, b_off = _pair_offsets(HALF, BLOCK_HALF, NEOX)
    base = x_ptr + t * stride_t + h[:, None] * stride_h
    xa = tl.load(base + a_off[None, :], mask=mask, other=0.0).to(tl.float32)
    xb = tl.load(base + b_off[None, :], mask=mask, other=0.0).to(tl.float32)
    ya = (xa * cos[None, :] - xb * sin[None, :]).to(x_ptr.dtype.element_ty)
    yb = (xb * cos[None, :] + xa * sin[None, :]).to(x_ptr.dtype.element_ty)
    tl.store(base + a_off[None, :], ya, mask=mask)
    tl.store(base + b_off[None, :], yb, mask=mask)
    return ya, yb, mask


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, positions_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_table,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr,
    NEOX: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    cos, sin = _cos_sin(cos_ptr, sin_ptr, positions_ptr, t, stride_table, HALF, BLOCK_HALF)
    _rotate_heads(q_ptr, stride_qt, stride_qh, t, cos, sin, NUM_Q_HEADS, HALF, BLOCK_QH,
                  BLOCK_HALF, NEOX)  # fmt: skip
    _rotate_heads(k_ptr, stride_kt, stride_kh, t, cos, sin, NUM_K_HEADS, HALF, BLOCK_KH,
                  BLOCK_HALF, NEOX)  # fmt: skip


def apply_rotary(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, Hq, D], k: [T, Hk, D] (rotated in place and returned); positions: [T];
    cos, sin: [max_position, D]. Positions must be < max_position."""
    check_rotary(positions, q, k, cos, sin)
    num_tokens, num_q_heads, dim = q.shape
    if num_tokens == 0:
        return q, k
    half = dim // 2
    _rotary_kernel[(num_tokens,)](
        q, k, cos, sin, positions,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0),
        NUM_Q_HEADS=num_q_heads, NUM_K_HEADS=k.shape[1], HALF=half,
        BLOCK_QH=next_pow2(num_q_heads), BLOCK_KH=next_pow2(k.shape[1]),
        BLOCK_HALF=next_pow2(half), NEOX=neox,
    )  # fmt: skip
    return q, k


def check_rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """apply_rotary's argument checks (rotary_cache.py's too)."""
    check_tensor("q", q, 3, FLOAT_DTYPES)
    check_tensor("k", k, 3, (q.dtype,), q.device)
    check_tensor("positions", positions, 1, INDEX_DTYPES, q.device)
    check_tensor("cos", cos, 2, FLOAT_DTYPES, q.device)
    check_tensor("sin", sin, 2, (cos.dtype,), q.device)
    num_tokens, _, dim = q.shape
    check(dim % 2 == 0, f"head_dim must be even, got {dim}")
    check(
        k.shape[0] == num_tokens and k.shape[2] == dim,
        f"k shape {tuple(k.shape)} vs q {tuple(q.shape)}",
    )
    check_shape("positions", positions, (num_tokens,))
    check(cos.shape[1] == dim, f"cos/sin rows have {cos.shape[1]} values for head_dim {dim}")
    check_shape("sin", sin, cos.shape)
    check(cos.stride(0) == sin.stride(0), "cos and sin need the same row stride")


def apply_rotary_ref(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Out of place, in float32, cast back."""
    c = cos[positions].float().unsqueeze(1)
    s = sin[positions].float().unsqueeze(1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        if neox:
            half = x.shape[-1] // 2
            rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
            return (xf * c + rotated * s).to(x.dtype)
        # Interleaved pairs read cos/sin from the first half of the table, one per pair.
        half = x.shape[-1] // 2
        ca, sa = c[..., :half], s[..., :half]
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((a * ca - b * sa, b * ca + a * sa), dim=-1).flatten(-2)
        return out.to(x.dtype)

    return rotate(q), rotate(k)
