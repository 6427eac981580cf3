"""Vocab-parallel input embedding and LM head.

Each rank holds a contiguous slice of the (padded) vocabulary. The embedding looks up only
the ids in its slice, zeroes the rest and all-reduces; the LM head computes logits for its
slice and all-gathers them, so every rank sees the full row and samples the same token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.checkpoint import copy_into
from engine.layers import cpu_gemm, quant
from engine.parallel import SINGLE, TPGroup


def _padded_vocab(vocab_size: int, tp: TPGroup) -> int:
    return -(-vocab_size // tp.size) * tp.size


class VocabParallelEmbedding(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        tp: TPGroup = SINGLE,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.per_rank = _padded_vocab(vocab_size, tp) // tp.size
        self.start = tp.rank * self.per_rank
        # Zeros: the padding rows past the vocabulary are never loaded.
        self.weight = nn.Parameter(torch.zeros(self.per_rank, hidden_size, dtype=dtype), False)
        self.weight.weight_loader = self._load  # type: ignore[attr-defined]

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, *_: object) -> None:
        # Rows of the vocabulary: the matrix, or an INT8 checkpoint's per-row scales.
        if loaded.shape[0] != self.vocab_size or loaded.shape[1:] != param.shape[1:]:
            raise ValueError(
                f"shape mismatch for the vocabulary matrix: expected "
                f"({self.vocab_size}, {', '.join(map(str, param.shape[1:]))}), checkpoint "
                f"has {tuple(loaded.shape)}"
            )
        end = min(self.start + self.per_rank, self.vocab_size)
        copy_into(param.data[: end - self.start], loaded[self.start : end])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.per_rank)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        tp: TPGroup = SINGLE,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(vocab_size, hidden_size, tp, dtype)

        self.use_cpu_gemm = False
        """Route the GEMM through engine/layers/cpu_gemm.py (set after loading, CPU fp32)."""
        self.register_buffer("weight_scale", None)
        """Per-row scales once quantized (engine/layers/quant.py); a tied head then holds an
        int8 copy and the embedding keeps its float rows."""
        self.int8_activations = False
        """Quantized W8A8: the hidden rows are quantized too (engine/layers/quant.py)."""
        self.register_buffer("weight_sum", None)
        """W8A8: each int8 weight row's sum (quant.finish), for the VNNI kernel."""

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self.weight_scale is not None:
            logits = quant.int8_linear(
                hidden, self.weight, self.weight_scale, None, self.int8_activations, self.weight_sum
            )
        elif self.use_cpu_gemm:
            logits = cpu_gemm.linear(hidden, self.weight, None)
        else:
            logits = F.linear(hidden, self.weight)
        logits = self.tp.all_gather_last_dim(logits)
        return logits[..., : self.vocab_size]
