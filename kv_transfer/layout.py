"""Where a (layer, block) lives inside a worker's KV cache, and how to describe a transfer.

The engine keeps ONE contiguous tensor per worker:

    kv[num_layers, num_blocks, 2, block_size, num_kv_heads, head_dim]

so the K and V of one block of one layer sit next to each other in one region:

    offset(layer, block) = (layer * num_blocks + block) * block_bytes
    block_bytes          = 2 * block_size * num_kv_heads * head_dim * elem_size

    |<------------------- layer 0 ------------------->|<---- layer 1 ---- ...
    | block 0 | block 1 | block 2 | ... | block N-1   | block 0 | ...
    |  K  V   |  K  V   |

A transfer of one layer pairs source block ids with destination block ids one to one;
runs where both sides are consecutive merge into one (src_offset, dst_offset, nbytes)
region, so a prompt whose blocks were allocated in order moves as a few large regions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

LAYOUT_NAME = "layer,block,kv,token,head,dim"
"""Name of the layout above; part of the handshake so both sides agree on the offsets."""

_ELEM_SIZES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "uint8": 1,
    "int8": 1,
}

Region = tuple[int, int, int]
"""(src_offset, dst_offset, nbytes), offsets in bytes from the start of each side's cache."""


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of one worker's KV cache tensor (see the module docstring for the layout)."""

    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "float16"
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_blocks", "block_size", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"KVCacheSpec.{name} must be a positive int, got {value!r}")
        if self.dtype not in _ELEM_SIZES:
            raise ValueError(
                f"KVCacheSpec.dtype {self.dtype!r} is not one of {sorted(_ELEM_SIZES)}"
            )
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank {self.tp_rank} outside [0, tp_size={self.tp_size})")

    @property
    def elem_size(self) -> int:
        return _ELEM_SIZES[self.dtype]

    @property
    def shape(self) -> tuple[int, int, int, int, int, int]:
        return (
            self.num_layers,
            self.num_blocks,
            2,
            self.block_size,
            self.num_kv_heads,
            self.head_dim,
        )

    @property
    def block_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_dim * self.elem_size

    @property
    def layer_bytes(self) -> int:
        """Distance between the same block of two consecutive layers."""
        return self.num_blocks * self.block_bytes

    @property
    def total_bytes(self) -> int:
        return self.num_layers * self.layer_bytes

    def block_offset(self, layer: int, block_id: int) -> int:
        return layer * self.layer_bytes + block_id * self.block_bytes

    def check_layers(self, layers: Sequence[int]) -> None:
        """Raise ValueError unless `layers` are distinct layer indices of this cache."""
        _check_indices(layers, self.num_layers, "layer")

    def check_block_ids(self, block_ids: Sequence[int], what: str = "block id") -> None:
        """Raise ValueError unless `block_ids` are distinct blocks of this cache."""
        _check_indices(block_ids, self.num_blocks, what)


def _check_indices(values: Sequence[int], bound: int, what: str) -> None:
    """Distinct and inside [0, bound). Builtins over the whole list, a Python loop only to
    name the culprit: this runs on every per-layer send, on the caller's thread."""
    if not values:
        return
    if len(set(values)) != len(values):
        raise ValueError(f"duplicate {what} in {list(values)}")
    if min(values) < 0 or max(values) >= bound:
        bad = next(v for v in values if not 0 <= v < bound)
        raise ValueError(f"{what} {bad} outside [0, {bound})")


def dtype_name(dtype: object) -> str:
    """'torch.float16' / numpy dtype('float16') / 'float16' -> 'float16'."""
    return str(dtype).removeprefix("torch.")


def pair_regions(
    src_spec: KVCacheSpec,
    dst_spec: KVCacheSpec,
    layer: int,
    src_block_ids: Sequence[int],
    dst_block_ids: Sequence[int],
) -> list[Region]:
    """Regions that copy block src_block_ids[i] of `layer` onto dst_block_ids[i], merged
    wherever both sides continue consecutively. Both specs have equal block_bytes (the
    handshake checks it); their num_blocks may differ."""
    return pair_regions_layers(src_spec, dst_spec, [layer], src_block_ids, dst_block_ids)


def pair_regions_layers(
    src_spec: KVCacheSpec,
    dst_spec: KVCacheSpec,
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
    block_bytes = src_spec.block_bytes
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
        src_shift, dst_shift = layer * src_spec.layer_bytes, layer * dst_spec.layer_bytes
        regions += [(s + src_shift, d + dst_shift, n) for s, d, n in base]
    return regions


def _is_run(block_ids: Sequence[int]) -> bool:
    """Consecutive ascending ids (b, b + 1, ...)."""
    first = block_ids[0]
    return list(block_ids) == list(range(first, first + len(block_ids)))
