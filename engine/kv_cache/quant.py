"""Quantized KV cache entries: INT8 (CPU and any device) and FP8 e4m3 (GPUs), one float16
scale per (token, head), stored in the entry's last two bytes:

    entry of one token, one head:  | q_0 q_1 ... q_{D-1} | scale (float16, 2 bytes) |
                                     quantized values      x ~= q * scale

Per (token, head), not per block: a block fills one token at a time during decode, so a
per-block scale would either be fixed before its tokens are known or requantize the block
as it grows. The cost is 2 bytes on D: a head of 64 takes 66 bytes, 26% of float32's 256.
Keeping the scale inside the entry keeps one tensor per cache, so the KV transfer, the
offload tiers and the block copies move quantized blocks with their scales unchanged
(core/kv_layout.py counts the bytes).

The scale is rounded to float16 before the values are divided by it, so dequantizing with
the stored scale gives back exactly what was quantized. Scales are clamped below at
float16's smallest normal value, so a head of zeros stays zeros and never divides by 0.
"""

from __future__ import annotations

import torch

from core.kv_layout import SCALE_BYTES

LARGEST = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
"""The quantized cache dtypes (core.kv_layout.QUANTIZED_DTYPES) and their largest value."""
_MIN_SCALE = 2.0**-14


def is_quantized(cache: torch.Tensor) -> bool:
    return cache.dtype in LARGEST


def quantize(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x: [..., D] float -> [..., D + 2] entries of `dtype` (int8 or float8_e4m3fn)."""
    limit = LARGEST[dtype]
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / limit).clamp_min(_MIN_SCALE).half()
    scaled = xf / scale.float()
    out = torch.empty(*x.shape[:-1], x.shape[-1] + SCALE_BYTES, dtype=dtype, device=x.device)
    if dtype == torch.int8:
        out[..., : x.shape[-1]] = scaled.round_().clamp_(-limit, limit).to(dtype)
    else:
        out[..., : x.shape[-1]] = scaled.clamp_(-limit, limit).to(dtype)
    scales(out).copy_(scale)
    return out


def dequantize(entries: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., D + 2] entries -> [..., D] values in `dtype`."""
    values = entries[..., :-SCALE_BYTES]
    return values.to(dtype) * scales(entries).to(dtype)


def scales(entries: torch.Tensor) -> torch.Tensor:
    """The float16 scales of `entries` ([..., D + 2], last dimension contiguous) as a view
    [..., 1]."""
    return entries[..., -SCALE_BYTES:].view(torch.float16)
