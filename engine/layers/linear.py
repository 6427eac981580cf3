"""Tensor-parallel linear layers, each parameter carrying its own weight loader.

A checkpoint tensor is always the *full* (unsharded) HF tensor, in the file's dtype; the
parameter's `weight_loader(param, loaded, shard_id)` copies this rank's slice into place,
casting on the way (`checkpoint.copy_into`), so one loading loop serves every TP size and the
merged (QKV, gate+up) projections, and no cast copy of a whole tensor is ever made.

    column parallel:  y_r = x @ W_r^T        W split by output rows; no communication
    row parallel:     y = sum_r x_r @ W_r^T  W split by input columns; all-reduce
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.kv_layout import kv_head_range
from engine.checkpoint import copy_into
from engine.layers import cpu_gemm, quant
from engine.layers.activation import silu_and_mul
from engine.parallel import SINGLE, TPGroup, divide

WeightLoader = Callable[..., None]


def _check_shape(name: str, expected: torch.Size, got: torch.Size) -> None:
    if expected != got:
        raise ValueError(
            f"shape mismatch for {name}: the model expects {tuple(expected)} for this shard, "
            f"the checkpoint slice is {tuple(got)}"
        )


def _set_loader(param: nn.Parameter, loader: WeightLoader) -> None:
    param.weight_loader = loader  # type: ignore[attr-defined]


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, *_: object) -> None:
    _check_shape(getattr(param, "hf_name", "parameter"), param.shape, loaded.shape)
    copy_into(param.data, loaded)


def _copy_shard(
    what: str, dst: torch.Tensor, loaded: torch.Tensor, dim: int, start: int, size: int
) -> None:
    """dst <- this rank's `size` entries of the full checkpoint tensor along `dim`."""
    shard = loaded.narrow(dim, start, size)
    _check_shape(what, dst.shape, shard.shape)
    copy_into(dst, shard)


class _ShardedLinear(nn.Module):
    """y = x @ W^T + b with W [out_features, in_features] split over the TP ranks along
    `split_dim` (the subclass's): each rank holds and loads its slice of the full checkpoint
    tensor. The bias is split with the output rows (dim 0); when the input columns are split
    (dim 1) every rank holds all of it, to add once after the all-reduce."""

    split_dim: int

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        tp: TPGroup = SINGLE,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.tp = tp
        shape = [out_features, in_features]
        what = ("output features", "input features")[self.split_dim]
        self.per_rank = divide(shape[self.split_dim], tp.size, what)
        shape[self.split_dim] = self.per_rank
        self.weight = nn.Parameter(torch.empty(shape, dtype=dtype), False)
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(shape[0], dtype=dtype), False)
        # A column split cuts the bias like the weight's rows; a row split keeps it whole.
        self._set_loaders(self._load_slice, default_weight_loader if self.split_dim else None)
        self.use_cpu_gemm = False
        """Route the GEMM through engine/layers/cpu_gemm.py (set after loading, CPU fp32)."""
        self.register_buffer("weight_scale", None)
        """Per-output-channel scales once quantized (engine/layers/quant.py): the weight is
        then int8."""
        self.int8_activations = False
        """Quantized W8A8: the input rows are quantized too (engine/layers/quant.py)."""
        self.register_buffer("weight_sum", None)
        """W8A8: each int8 weight row's sum (quant.finish), for the VNNI kernel."""
        self.lora: Any = None
        """An engine serving LoRA adapters: their weights for this layer (engine/lora)."""

    def _set_loaders(self, weight: WeightLoader, bias: WeightLoader | None = None) -> None:
        """`bias` defaults to the weight's loader (output-sharded biases are cut alike)."""
        _set_loader(self.weight, weight)
        if self.bias is not None:
            _set_loader(self.bias, bias or weight)

    def _load_slice(self, param: nn.Parameter, loaded: torch.Tensor, *_: object) -> None:
        what = f"{type(self).__name__} weight"
        start = self.tp.rank * self.per_rank
        _copy_shard(what, param.data, loaded, self.split_dim, start, self.per_rank)

    def shard_of(self, part: str | int | None = None) -> tuple[int, int, int]:
        """(offset in this rank's weight, start in the full checkpoint tensor, size) along
        `split_dim` of `part` (None: the whole, unfused, projection): where this rank's
        slice of a checkpoint tensor goes (the weight loaders; LoRA's A or B, engine/lora)."""
        return 0, self.tp.rank * self.per_rank, self.per_rank

    def add_lora(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y plus this step's LoRA deltas of x (engine/lora), if any adapter is on it."""
        if self.lora is not None:
            self.lora.add(x, y)
        return y

    def _gemm(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.weight_scale is not None:
            return quant.int8_linear(
                x, self.weight, self.weight_scale, bias, self.int8_activations, self.weight_sum
            )
        if self.use_cpu_gemm:
            return cpu_gemm.linear(x, self.weight, bias)
        return F.linear(x, self.weight, bias)


class ColumnParallelLinear(_ShardedLinear):
    split_dim = 0  # output rows: each rank computes its slice of y, no communication

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add_lora(x, self._gemm(x, self.bias))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input in one GEMM (gate + up).

    Rows of the fused weight on each rank:  [ shard of part 0 | shard of part 1 | ... ]
    """

    def __init__(
        self,
        in_features: int,
        out_sizes: list[int],
        bias: bool,
        tp: TPGroup = SINGLE,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, sum(out_sizes), bias, tp, dtype)
        self.part_sizes = [divide(s, tp.size, "output features") for s in out_sizes]
        self._set_loaders(self._load_part)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for a [gate | up] projection: in the GEMM's epilogue where our CPU
        kernel can fuse it (a 256-token prompt's MLP then writes and rereads no [256, 2I]
        intermediate), else the product and then the activation."""
        fusable = self.use_cpu_gemm and self.weight_scale is None and self.bias is None
        fusable = fusable and (self.lora is None or not self.lora.active)
        if fusable and len(self.part_sizes) == 2:
            y = cpu_gemm.silu_mul_linear(x, self.weight)
            if y is not None:
                return y
        return silu_and_mul(self(x))

    def shard_of(self, part: str | int | None = None) -> tuple[int, int, int]:
        assert isinstance(part, int)
        size = self.part_sizes[part]
        return sum(self.part_sizes[:part]), self.tp.rank * size, size

    def _load_part(self, param: nn.Parameter, loaded: torch.Tensor, part: int) -> None:
        offset, start, size = self.shard_of(part)
        dst = param.data.narrow(0, offset, size)
        _copy_shard(f"merged weight part {part}", dst, loaded, 0, start, size)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one GEMM; heads split over ranks.

    When TP size exceeds the number of KV heads, each KV head is replicated on
    `size / num_kv_heads` ranks (rank r holds KV head r * num_kv_heads // size).

    Rows on each rank:  [ q heads of this rank | k heads | v heads ] x head_dim
    """

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool,
        tp: TPGroup = SINGLE,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.head_dim = head_dim
        self.num_heads = divide(num_heads, tp.size, "attention heads")
        if tp.size >= num_kv_heads:
            divide(tp.size, num_kv_heads, "KV-head replication (TP size / KV heads)")
            self.num_kv_heads = 1
        else:
            self.num_kv_heads = divide(num_kv_heads, tp.size, "KV heads")
        self.total_kv_heads = num_kv_heads
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim
        super().__init__(hidden_size, out * tp.size, bias, tp, dtype)
        self._set_loaders(self._load_qkv)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def shard_of(self, part: str | int | None = None) -> tuple[int, int, int]:
        if part == "q":
            src_head, offset, size = self.tp.rank * self.num_heads, 0, self.q_size
        else:
            src_head = kv_head_range(self.total_kv_heads, self.tp.size, self.tp.rank).start
            offset = self.q_size + (0 if part == "k" else self.kv_size)
            size = self.kv_size
        return offset, src_head * self.head_dim, size

    def _load_qkv(self, param: nn.Parameter, loaded: torch.Tensor, part: str) -> None:
        offset, start, size = self.shard_of(part)
        dst = param.data.narrow(0, offset, size)
        _copy_shard(f"{part}_proj", dst, loaded, 0, start, size)


class RowParallelLinear(_ShardedLinear):
    split_dim = 1  # input columns: each rank computes a partial y, summed by an all-reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self.add_lora(x, self._gemm(x, self.bias))
        # Bias once, after the sum, so it is not counted size times; a LoRA delta of this
        # rank's input columns is partial like the GEMM's, so it joins the same sum.
        y = self.tp.all_reduce(self.add_lora(x, self._gemm(x, None)))
        return y if self.bias is None else y + self.bias
