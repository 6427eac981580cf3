"""Resident adapters' weights on one linear layer, and the segmented LoRA matmul of a step.

Each linear layer holds every slot's adapter stacked, in this rank's shard, transposed from
PEFT's A [r, in] and B [out, r] so that both products read them as stored:

    a [slots, in, parts * R]    parts: the projections fused in the layer (q, k, v: 3;
    b [slots, parts * R, out]          gate, up: 2; o, down: 1), R: the engine's max rank

Part p of an adapter of rank r fills columns [p*R, p*R + r) of its slot's `a` and, in `b`,
the same rows in the columns its projection has in the layer's output: `b` is
block-diagonal, so one pair of matmuls per slot gives every fused projection its own delta.
Unused rank and absent projections stay zero, which adds exactly nothing. A column-parallel
layer holds B's output columns of its shard (those of its weight's rows: `shard_of`); a
row-parallel one A's input rows of its shard, its partial delta summed by the layer's
all-reduce.

`LoRABatch` is a step's rows grouped by slot; `add_lora` adds `(x @ a_s) @ b_s` to each
group's rows: torch's matmuls on CPU (one pair per adapter in the step: the scheduler puts
an adapter's requests together, so its rows are one run); on a GPU the segmented kernel
(engine/kernels/lora.py) does every row in two launches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.lora.adapter import LoRAAdapter

Rows = slice | torch.Tensor
"""A group's rows of the step: one contiguous run, or their indices."""


@dataclass(frozen=True)
class LoRABatch:
    groups: tuple[tuple[int, Rows], ...]
    """(slot, its rows) for each adapter in the step; rows without an adapter are in none."""
    row_slots: torch.Tensor | None = None
    """On CUDA: every row's slot (-1: none), for the Triton kernel (engine/kernels/lora.py)."""


class LoRAContext:
    """What every layer's `LoRALinear` reads: this step's batch (None: no adapter in it)."""

    batch: LoRABatch | None = None


def add_lora(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
             batch: LoRABatch) -> None:  # fmt: skip
    """y[rows] += (x[rows] @ a[slot]) @ b[slot] for every group: the reference the GPU
    kernel is tested against, and the CPU path."""
    for slot, rows in batch.groups:
        if isinstance(rows, slice):
            y[rows].addmm_(x[rows] @ a[slot], b[slot])
        else:
            y.index_add_(0, rows, (x.index_select(0, rows) @ a[slot]) @ b[slot])


class LoRALinear:
    """The slots' A and B of one linear layer (see the module's docstring)."""

    def __init__(
        self,
        linear: torch.nn.Module,
        layer: int,
        parts: tuple[tuple[str, str | int | None], ...],
        slots: int,
        max_rank: int,
        context: LoRAContext,
        dtype: torch.dtype,
    ) -> None:
        """`parts`: (projection name, the layer's part id for `shard_of`) in fused order;
        `dtype`: the model's (an INT8 layer's activations are in it too)."""
        self.layer, self.parts, self.max_rank, self.context = layer, parts, max_rank, context
        self.column = linear.split_dim == 0
        self.shards = [linear.shard_of(part) for _, part in parts]
        out, inp = linear.weight.shape
        width = len(parts) * max_rank
        device = linear.weight.device
        self.a = torch.zeros(slots, inp, width, dtype=dtype, device=device)
        self.b = torch.zeros(slots, width, out, dtype=dtype, device=device)

    @property
    def active(self) -> bool:
        return self.context.batch is not None

    def load(self, slot: int, adapter: LoRAAdapter) -> None:
        a, b, rank = self.a[slot], self.b[slot], self.max_rank
        a.zero_()
        b.zero_()
        for p, ((proj, _), (offset, start, size)) in enumerate(zip(self.parts, self.shards)):
            pair = adapter.weights.get((self.layer, proj))
            if pair is None:
                continue
            lora_a, lora_b = pair
            r, c = lora_a.shape[0], p * rank
            if self.column:
                a[:, c : c + r].copy_(lora_a.T)
                b[c : c + r, offset : offset + size].copy_(lora_b[start : start + size].T)
            else:
                a[:, c : c + r].copy_(lora_a[:, start : start + size].T)
                b[c : c + r].copy_(lora_b.T)

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        batch = self.context.batch
        if batch is None:
            return
        if batch.row_slots is not None:
            from engine.kernels.lora import lora_add  # Triton: only where a GPU runs

            lora_add(y, x, self.a, self.b, batch.row_slots)
            return
        add_lora(y, x, self.a, self.b, batch)
