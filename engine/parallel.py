"""The one small interface tensor parallelism talks through.

Layers receive a `TPGroup` at construction (never a module global), so a model built for
TP=1 does no communication at all and the same code runs sharded when a group is given.
Collectives go over `torch.distributed` (NCCL on GPU, gloo on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1
    group: Any = None
    """A torch.distributed ProcessGroup when size > 1."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} outside size {self.size}")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the group, in place; identity at size 1."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate each rank's `x` along the last dimension, in rank order."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def max_over_ranks(self, values: list[int], device: torch.device) -> list[int]:
        """The element-wise max of every rank's `values`, the same on every rank. `device`
        holds the collective's tensor (NCCL reduces only on the GPU)."""
        if self.size == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return [int(v) for v in t.tolist()]


SINGLE = TPGroup()


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator != 0:
        raise ValueError(
            f"{what}={numerator} is not divisible by tensor-parallel size {denominator}"
        )
    return numerator // denominator
