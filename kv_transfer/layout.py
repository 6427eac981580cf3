"""How to describe a transfer between two KV caches as byte regions.

Where a (layer, block) lives in a cache is `core.kv_layout.KVLayout` (the layout and its
offsets are drawn there). A transfer of one layer pairs source block ids with destination
block ids one to one; runs where both sides are consecutive merge into one (src_offset,
dst_offset, nbytes) region, so a prompt whose blocks were allocated in order moves as a
few large regions.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.kv_layout import KVLayout

Region = tuple[int, int, int]
"""(src_offset, dst_offset, nbytes), offsets in bytes from the start of each side's cache."""


def pair_regions(
    src_layout: KVLayout,
    dst_layout: KVLayout,
    layer: int,
    src_block_ids: Sequence[int],
    dst_block_ids: Sequence[int],
) -> list[Region]:
    """Regions that copy block src_block_ids[i] of `layer` onto dst_block_ids[i], merged
    wherever both sides continue consecutively. Both layouts have equal block_bytes (the
    handshake checks it); their num_blocks may differ."""
    return pair_regions_layers(src_layout, dst_layout, [layer], src_block_ids, dst_block_ids)


def pair_regions_layers(
    src_layout: KVLayout,
    dst_layout: KVLayout,
    layers: Sequence[int],
    src_block_ids: Sequence[int],
    dst_block_ids: Sequence[int],
) -> list[Region]:
    """`pair_regions` for each of `layers`, in order. The block pairing is the same in every
    layer, so it is worked out once and shifted by each layer's offset on either side."""
    if len(src_block_ids) != len(dst_block_ids):
        raise ValueError(
            f"{len(src_block_ids)} source blocks but {len(dst_block_ids)} destination blocks"
        )
    block_bytes = src_layout.block_bytes
    runs: list[list[int]] = []  # [src block, dst block, number of blocks]
    n = len(src_block_ids)
    if n and _is_run(src_block_ids) and _is_run(dst_block_ids):  # the usual case, in C
        runs.append([src_block_ids[0], dst_block_ids[0], n])
    else:
        prev_src = prev_dst = -2
        for src, dst in zip(src_block_ids, dst_block_ids):
            if runs and src == prev_src + 1 and dst == prev_dst + 1:
                runs[-1][2] += 1
            else:
                runs.append([src, dst, 1])
            prev_src, prev_dst = src, dst
    base = [(src * block_bytes, dst * block_bytes, n * block_bytes) for src, dst, n in runs]
    regions: list[Region] = []
    for layer in layers:
        src_shift, dst_shift = layer * src_layout.layer_bytes, layer * dst_layout.layer_bytes
        regions += [(s + src_shift, d + dst_shift, n) for s, d, n in base]
    return regions


def _is_run(block_ids: Sequence[int]) -> bool:
    """Consecutive ascending ids (b, b + 1, ...)."""
    first = block_ids[0]
    return list(block_ids) == list(range(first, first + len(block_ids)))
