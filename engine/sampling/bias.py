"""Additive per-token logit adjustments: OpenAI's `logit_bias`, and the ban (a bias of
-inf) that keeps stop tokens out until a request's `min_tokens`.

Sparse: a row names only the tokens it touches, so a step costs O(biased tokens), not
O(vocab). Applied to the sampler's private float32 copy after the grammar mask and before
penalties and temperature, as vLLM applies logit_bias; logprobs stay the model's own.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import torch

from engine.device import host_to_device

TokenBias = Mapping[int, float]
"""token id -> value added to its logit (-inf bans it)."""


def row_bias(logit_bias: Sequence[tuple[int, float]], banned: Collection[int]) -> TokenBias | None:
    """One row's adjustments (None: it has none); a banned token stays banned whatever its
    bias, so `min_tokens` holds even against a +100 bias on EOS."""
    if not logit_bias and not banned:
        return None
    bias = dict(logit_bias)
    bias.update(dict.fromkeys(banned, float("-inf")))
    return bias


def apply_bias_(logits: torch.Tensor, biases: Sequence[TokenBias | None]) -> None:
    """Add each row's bias to `logits` [rows, vocab], in place; token ids past the vocabulary
    (checked at the front door; a padded LM head) are skipped."""
    vocab_size = logits.shape[1]
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    for i, bias in enumerate(biases):
        for token_id, value in (bias or {}).items():
            if 0 <= token_id < vocab_size:
                rows.append(i)
                cols.append(token_id)
                values.append(value)
    if not rows:
        return
    device = logits.device
    index = (host_to_device(rows, torch.long, device), host_to_device(cols, torch.long, device))
    # (row, token) pairs are unique (a dict per row), so a plain gather-add-scatter is exact.
    logits[index] = logits[index] + host_to_device(values, logits.dtype, device)
