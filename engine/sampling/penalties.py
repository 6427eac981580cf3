"""Repetition, frequency and presence penalties, applied sparsely.

Only the (row, token) cells that occur in a row's prompt or output are read and written, so the
cost is O(tokens in the penalised rows), never O(rows x vocab). Semantics follow vLLM / OpenAI:

    repetition (over prompt + output):  l > 0 ? l / r : l * r
    frequency  (over output):           l -= frequency_penalty * count(token in output)
    presence   (over output):           l -= presence_penalty * (count > 0)

Repetition is applied first, then frequency and presence, as vLLM does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def has_penalty(repetition: float, frequency: float, presence: float) -> bool:
    return repetition != 1.0 or frequency != 0.0 or presence != 0.0


def _ids_tensor(ids: Sequence[int]) -> torch.Tensor:
    """Token ids as a flat int64 CPU tensor (accepts lists, tuples, numpy arrays, tensors)."""
    if isinstance(ids, torch.Tensor):
        return ids.detach().reshape(-1).to(device="cpu", dtype=torch.int64)
    try:
        return torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
    except (TypeError, ValueError):
        return torch.tensor(list(ids), dtype=torch.int64)


def _cell_keys(
    row_ids: Sequence[int], id_lists: Sequence[Sequence[int]], vocab_size: int, what: str
) -> torch.Tensor:
    """Flat keys `row * vocab_size + token` for every token of every given row."""
    parts = [_ids_tensor(ids) for ids in id_lists]
    lengths = torch.tensor([p.numel() for p in parts], dtype=torch.int64)
    flat = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= vocab_size):
        bad = flat[(flat < 0) | (flat >= vocab_size)][0].item()
        raise ValueError(f"{what} token id {bad} is outside the vocabulary [0, {vocab_size})")
    rows = torch.repeat_interleave(torch.tensor(row_ids, dtype=torch.int64), lengths)
    return rows * vocab_size + flat


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    repetition: Sequence[float],
    frequency: Sequence[float],
    presence: Sequence[float],
) -> None:
    """Penalise `logits` ([rows, vocab], float, modified in place); one entry per row in each list.

    Rows whose penalties are all neutral are left untouched.
    """
    num_rows, vocab_size = logits.shape
    device = logits.device

    rep_rows = [i for i in range(num_rows) if repetition[i] != 1.0]
    if rep_rows:
        keys = torch.cat(
            [
                _cell_keys(rep_rows, [prompt_token_ids[i] for i in rep_rows], vocab_size, "prompt"),
                _cell_keys(rep_rows, [output_token_ids[i] for i in rep_rows], vocab_size, "output"),
            ]
        ).unique()
        rows, cols = (keys // vocab_size).to(device), (keys % vocab_size).to(device)
        factor = torch.tensor(repetition, dtype=logits.dtype, device=device)[rows]
        cells = logits[rows, cols]
        logits[rows, cols] = torch.where(cells > 0, cells / factor, cells * factor)

    additive_rows = [i for i in range(num_rows) if frequency[i] != 0.0 or presence[i] != 0.0]
    if additive_rows:
        outputs = [output_token_ids[i] for i in additive_rows]
        keys, counts = _cell_keys(additive_rows, outputs, vocab_size, "output").unique(
            return_counts=True
        )
        rows, cols = (keys // vocab_size).to(device), (keys % vocab_size).to(device)
        freq = torch.tensor(frequency, dtype=logits.dtype, device=device)[rows]
        pres = torch.tensor(presence, dtype=logits.dtype, device=device)[rows]
        logits[rows, cols] -= freq * counts.to(device=device, dtype=logits.dtype) + pres
