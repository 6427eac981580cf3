"""RMSNorm, optionally fused with the residual add that precedes it (the Llama pattern
`h = x + residual; y = norm(h)`), computed exactly as Hugging Face does so greedy outputs
match: normalise in float32, cast back, then scale by the weight."""

from __future__ import annotations

import torch
from torch import nn

from engine.device import cpu_fused_ops, use_fused_kernels


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (normed, new residual). With `residual` given, the add happens first."""
        if x.dim() == 2 and use_fused_kernels(x):
            from engine.kernels.rms_norm import rms_norm

            return rms_norm(x, self.weight, self.eps, residual)
        ops = cpu_fused_ops(x)
        if ops is not None and self.weight.dtype == x.dtype and _fusable(residual, x):
            if residual is None:
                return ops.rms_norm(x, self.weight, self.eps), x
            out, summed = ops.add_rms_norm(x, residual, self.weight, self.eps)
            return out, summed
        if residual is not None:
            x = x + residual
        return self._norm(x), x

    def norm_only(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x)


def _fusable(residual: torch.Tensor | None, x: torch.Tensor) -> bool:
    return residual is None or (residual.is_contiguous() and residual.dtype == x.dtype)
