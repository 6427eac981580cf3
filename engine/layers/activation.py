"""SiLU-and-multiply over a fused [gate | up] projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.device import cpu_fused_ops, use_fused_kernels


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if gate_up.dim() == 2 and use_fused_kernels(gate_up):  # one kernel instead of two
        from engine.kernels.silu_and_mul import silu_and_mul as fused

        return fused(gate_up)
    ops = cpu_fused_ops(gate_up)
    if ops is not None:  # one pass instead of three (silu, chunk copy, mul)
        return ops.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
