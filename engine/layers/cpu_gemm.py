"""Linear layers on CPU through oneDNN with pre-packed weights.

Why: PyTorch's default CPU linear (MKL sgemm) is slow for the small batches of decode: on
the 2-core machines here a 125M model's weights stream at ~13 GB/s at batch 1 and ~7 GB/s
at batch 16, while oneDNN with weights reordered once into its blocked layout reaches
~23 GB/s and ~17 GB/s, and is ~25% faster for prefill-sized batches too (measured: see
bench/engine.py). The packed tensor replaces the dense weight after loading, so memory
does not grow. BATON_ONEDNN=0 keeps the plain path.
"""

from __future__ import annotations

import os

import torch
from torch import nn

_BATCH_HINT = 16
"""oneDNN picks its blocking for this many rows; any row count works."""


def enabled(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and os.environ.get("BATON_ONEDNN", "1") != "0"
    )


def pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _BATCH_HINT)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


def pack_model(model: nn.Module) -> int:
    """Pack every layer that has a `packed` slot; returns how many. Dense weights that no
    other module shares are released."""
    shared = {id(p) for name, p in model.named_parameters() if "embed_tokens" in name}
    count = 0
    for module in model.modules():
        if not hasattr(module, "packed") or getattr(module, "weight", None) is None:
            continue
        weight = module.weight
        module.packed = pack(weight)
        if id(weight) not in shared:
            weight.data = torch.empty(0, dtype=weight.dtype)
        count += 1
    return count
