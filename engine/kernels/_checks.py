"""Argument checks shared by the host wrappers: a bad launch fails here with a message
naming the argument, not inside the kernel with a wrong answer or an illegal address."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import triton.language as tl

from core.kv_layout import SCALE_BYTES
from engine.kv_cache.quant import LARGEST

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
QUANTIZED_CACHE = LARGEST
"""Quantized cache dtypes (engine/kv_cache/quant.py's entries) and their largest value."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def check_tensor(
    name: str,
    t: torch.Tensor,
    ndim: int,
    dtypes: Sequence[torch.dtype],
    device: torch.device | None = None,
) -> None:
    check(isinstance(t, torch.Tensor), f"{name} must be a tensor, got {type(t).__name__}")
    check(t.dim() == ndim, f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    check(t.dtype in dtypes, f"{name} has dtype {t.dtype}; expected one of {list(dtypes)}")
    if device is not None:
        check(t.device == device, f"{name} is on {t.device}, expected {device}")
    if t.numel():
        # Kernels index the last dimension with unit stride (vector loads).
        check(
            t.shape[-1] == 1 or t.stride(-1) == 1,
            f"{name} must be contiguous in its last dimension (strides {t.stride()})",
        )


def check_shape(name: str, t: torch.Tensor, shape: Sequence[int]) -> None:
    check(
        tuple(t.shape) == tuple(shape),
        f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}",
    )


def check_kv_layer(
    kv_layer: torch.Tensor, dtype: torch.dtype, device: torch.device
) -> tuple[int, int, int]:
    """One layer of the paged cache, [num_blocks, 2 (K, V), page, Hk, E], of the model's
    `dtype` or quantized (E = D + the scale's bytes): (page, Hk, D)."""
    check_tensor("kv_layer", kv_layer, 5, (dtype, *QUANTIZED_CACHE), device)
    _, two, page, num_kv_heads, entry = kv_layer.shape
    check(two == 2, f"kv_layer dim 1 must be 2 (K, V), got {two}")
    check(kv_layer.stride(3) == entry, "kv_layer must be contiguous over (kv_heads, head_dim)")
    return page, num_kv_heads, entry - (SCALE_BYTES if kv_layer.dtype in QUANTIZED_CACHE else 0)


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def dot_precision(dtype: torch.dtype) -> str:
    """float32 dots stay exact (no TF32) so a float32 model can match its reference."""
    return "ieee" if dot_dtype(dtype) == tl.float32 else "tf32"


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """The element type `tl.dot` operands are cast to: the input type on a GPU; float32 for
    bfloat16 under the interpreter, whose bfloat16 dot returns garbage (Triton 3.9)."""
    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        return tl.float32
    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[
        dtype
    ]
