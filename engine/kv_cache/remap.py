"""KV written in one cache layout, rewritten in another: how a decode worker takes a prompt's
KV from prefill workers whose caches are laid out otherwise (worker/landing.py).

Two caches of the same model may differ in three ways, and each is a change of index or of
number, never of meaning (core/preflight.py checks the meaning):

    block size      token t sits in block t // block_size, slot t % block_size: re-cut
                    by gathering tokens from one side's blocks and scattering them into
                    the other's
    TP size         each rank holds `core.kv_layout.kv_head_range` of the model's KV heads:
                    a rank's heads are joined from the sources that hold them (or cut out
                    of one that holds more)
    cache dtype     float caches convert; a quantized one (int8, fp8: an entry carries its
                    float16 scale, engine/kv_cache/quant.py) is dequantized, then the
                    values are quantized for the destination as its own engine would

Tokens move as whole (token, head) entries, so a layer costs one gather per source and one
scatter: torch indexing over every layer at once, on whatever device the caches are on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.kv_cache import quant


@dataclass(frozen=True)
class Source:
    """KV of some of the model's heads for a run of tokens, in a cache of another layout."""

    cache: torch.Tensor
    """[num_layers, num_blocks, 2, block_size, num_heads, entry_dim]"""
    block_ids: Sequence[int]
    """Its blocks, in token order: token `first_token` is slot 0 of block_ids[0]."""
    first_token: int
    heads: range
    """The model's KV heads it holds, in order."""


def land(
    cache: torch.Tensor,
    block_ids: Sequence[int],
    heads: range,
    tokens: range,
    sources: Sequence[Source],
) -> None:
    """Write `tokens` (positions in the request, all layers) into `cache`, a cache holding
    the model's KV heads `heads`, where the request's blocks are `block_ids` (token 0 in
    slot 0 of block_ids[0]). Every head of `heads` must be in some source, and every token
    of `tokens` in each source that gives one."""
    if not tokens:
        return
    block_size = cache.shape[3]
    device = cache.device
    positions = torch.arange(tokens.start, tokens.stop, device=device)
    parts, next_head = [], heads.start  # heads in order, each from the first source with it
    for src in sorted(sources, key=lambda s: s.heads.start):
        taken = range(max(next_head, src.heads.start), min(heads.stop, src.heads.stop))
        if taken and taken.start == next_head:
            parts.append(_gather(src, positions, taken, cache.dtype))
            next_head = taken.stop
    if next_head != heads.stop:
        raise ValueError(f"the sources hold heads up to {next_head} of {heads}, not all")
    values = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)
    if values.dtype != cache.dtype:  # float values of another dtype than the cache's
        quantized = quant.is_quantized(cache)
        values = quant.quantize(values, cache.dtype) if quantized else values.to(cache.dtype)
    ids = torch.as_tensor(list(block_ids), device=device)
    # Advanced indices around a slice: the indexed result is [tokens, layers, 2, heads, dim].
    cache[:, ids[positions // block_size], :, positions % block_size] = values


def _gather(src: Source, positions: torch.Tensor, heads: range, dtype: torch.dtype) -> torch.Tensor:
    """[tokens, layers, 2, len(heads), head_dim] of `src`, in `dtype` if nothing needs
    converting, else in float32 (the destination converts it)."""
    block_size = src.cache.shape[3]
    offsets = positions - src.first_token
    ids = torch.as_tensor(list(src.block_ids), device=src.cache.device)
    first = heads.start - src.heads.start
    entries = src.cache[:, ids[offsets // block_size], :, offsets % block_size]
    entries = entries[..., first : first + len(heads), :]
    if quant.is_quantized(src.cache):
        if src.cache.dtype == dtype:  # quantized alike: entries move with their scales
            return entries
        return quant.dequantize(entries, torch.float32)
    return entries if entries.dtype == dtype else entries.float()
