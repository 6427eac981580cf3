"""Triton kernels for the GPU path, one per file, each beside its plain-torch reference.

    decode_attention    paged decode attention, split-KV (flash-decoding) + reduce
    prefill_attention   paged prefill / extend attention: ragged chunks, causal, cached prefix
    reshape_and_cache   writing a step's new K/V into their cache slots
    rms_norm            RMSNorm with an optional fused residual add
    rotary              rotary embedding from a cos/sin table (default, linear, llama3)
    rotary_cache        rotary and reshape-and-cache in one launch (the attention layer's)

Every host wrapper checks shapes, dtypes and strides before it launches, and takes
preallocated outputs where the caller owns the memory.
"""

from __future__ import annotations

import os

import torch

# Without a CUDA device, Triton kernels can only run in its interpreter. The flag is read
# when `@triton.jit` decorates a kernel, so it must be set before the kernel modules load.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
