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

Tokens move as whole (token, head) entries in runs that lie in one block on both sides (a
block of the smaller size, or less), every layer at once: one copy of views a run, straight
from one cache into the other, with no gathered copy in between, on whatever device the
caches are on.
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
    of `tokens` in each source that gives one; nothing else of `cache` is written."""
    block_size = cache.shape[3]
    for src, taken in _heads_from(heads, sources):
        to_heads = slice(taken.start - heads.start, taken.stop - heads.start)
        from_heads = slice(taken.start - src.heads.start, taken.stop - src.heads.start)
        src_block_size = src.cache.shape[3]
        t = tokens.start
        while t < tokens.stop:  # runs of tokens in one block on both sides
            offset = t - src.first_token
            src_block, src_slot = src.block_ids[offset // src_block_size], offset % src_block_size
            dst_block, dst_slot = block_ids[t // block_size], t % block_size
            n = min(src_block_size - src_slot, block_size - dst_slot, tokens.stop - t)
            _convert_into(
                cache[:, dst_block, :, dst_slot : dst_slot + n, to_heads],
                src.cache[:, src_block, :, src_slot : src_slot + n, from_heads],
            )
            t += n


def _heads_from(heads: range, sources: Sequence[Source]) -> list[tuple[Source, range]]:
    """Which of `heads` each source gives: in order, each head from the first source with it."""
    taken_from, next_head = [], heads.start
    for src in sorted(sources, key=lambda s: s.heads.start):
        taken = range(max(next_head, src.heads.start), min(heads.stop, src.heads.stop))
        if taken and taken.start == next_head:
            taken_from.append((src, taken))
            next_head = taken.stop
    if next_head != heads.stop:
        raise ValueError(f"the sources hold heads up to {next_head} of {heads}, not all")
    return taken_from


def _convert_into(out: torch.Tensor, entries: torch.Tensor) -> None:
    """Copy `entries` into `out`, converted to how `out`'s cache stores values: as they are
    where both store alike (quantized entries with their scales), else through float32."""
    if entries.dtype == out.dtype or not (quant.is_quantized(entries) or quant.is_quantized(out)):
        out.copy_(entries)  # alike, or floats (copy_ converts)
        return
    values = quant.dequantize(entries, torch.float32) if quant.is_quantized(entries) else entries
    out.copy_(quant.quantize(values, out.dtype) if quant.is_quantized(out) else values)
