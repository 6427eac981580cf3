"""`KVLayout`: the geometry of one worker's KV cache, the one description of it that the
engine allocates from and the KV transport registers, checks and offsets by.

The engine keeps ONE contiguous tensor per worker:

    kv[num_layers, num_blocks, 2, block_size, num_kv_heads, head_dim]

so the K and V of one block of one layer sit next to each other in one region:

    offset(layer, block) = (layer * num_blocks + block) * block_bytes
    block_bytes          = 2 * block_size * num_kv_heads * entry_dim * elem_size

    |<------------------- layer 0 ------------------->|<---- layer 1 ---- ...
    | block 0 | block 1 | block 2 | ... | block N-1   | block 0 | ...
    |  K  V   |  K  V   |

Torch-free: the dtype is its name ("float16"), which the engine turns into a torch dtype
when it allocates, and which the transport's handshake compares as it is.

A quantized cache ("int8", "float8_e4m3fn": `QUANTIZED_DTYPES`) stores each (token, head)
entry as its head_dim quantized values followed by its float16 scale, so the last
dimension is `entry_dim = head_dim + 2` bytes and the scales travel with the blocks
(engine/kv_cache/quant.py): every byte count below, and so every transfer, counts them.
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


QUANTIZED_DTYPES = ("int8", "float8_e4m3fn")
"""Cache dtypes whose entries carry a scale (see the module docstring)."""
SCALE_BYTES = 2
"""A float16 scale per (token, head) entry of a quantized cache."""


@dataclass(frozen=True)
class KVLayout:
    """Shape of one worker's KV cache tensor (see the module docstring for the layout)."""

    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    """Heads held by this rank."""
    head_dim: int
    dtype: str = "float16"
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_blocks", "block_size", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"KVLayout.{name} must be a positive int, got {value!r}")
        if self.dtype not in _ELEM_SIZES:
            raise ValueError(f"KVLayout.dtype {self.dtype!r} is not one of {sorted(_ELEM_SIZES)}")
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank {self.tp_rank} outside [0, tp_size={self.tp_size})")

    @property
    def elem_size(self) -> int:
        return _ELEM_SIZES[self.dtype]

    @property
    def entry_dim(self) -> int:
        """Elements of one (token, head) entry: head_dim, plus the scale's bytes if quantized."""
        return self.head_dim + (SCALE_BYTES if self.dtype in QUANTIZED_DTYPES else 0)

    @property
    def shape(self) -> tuple[int, int, int, int, int, int]:
        return (
            self.num_layers,
            self.num_blocks,
            2,
            self.block_size,
            self.num_kv_heads,
            self.entry_dim,
        )

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of one layer (K and V): the unit the transport moves."""
        return 2 * self.block_size * self.num_kv_heads * self.entry_dim * self.elem_size

    @property
    def block_bytes_all_layers(self) -> int:
        """What one more block costs: its region in every layer."""
        return self.num_layers * self.block_bytes

    @property
    def layer_bytes(self) -> int:
        """Distance between the same block of two consecutive layers."""
        return self.num_blocks * self.block_bytes

    @property
    def total_bytes(self) -> int:
        return self.num_layers * self.layer_bytes

    def num_blocks_for_memory(self, memory_bytes: int) -> int:
        """How many blocks a cache of this geometry fits in `memory_bytes` (at least one)."""
        return max(1, memory_bytes // self.block_bytes_all_layers)

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


def kv_head_range(total_kv_heads: int, tp_size: int, tp_rank: int) -> range:
    """The model's KV heads that rank `tp_rank` of `tp_size` holds: an equal share each, or,
    past one rank per head, the one head it shares with `tp_size / total_kv_heads` ranks
    (engine/layers/linear.py's QKVParallelLinear shards the weights by this rule)."""
    if tp_size >= total_kv_heads:
        head = tp_rank * total_kv_heads // tp_size
        return range(head, head + 1)
    share = total_kv_heads // tp_size
    return range(tp_rank * share, (tp_rank + 1) * share)


def first_holders(heads: range, held: Sequence[range]) -> list[int]:
    """Of ranks holding `held[p]` heads each, the ones `heads` are read from: each head from
    the first rank (by its first head) that holds it (worker/landing.py)."""
    chosen, next_head = [], heads.start
    for p in sorted(range(len(held)), key=lambda p: held[p].start):
        if held[p].start <= next_head < held[p].stop and next_head < heads.stop:
            chosen.append(p)
            next_head = min(held[p].stop, heads.stop)
    return chosen


def landing_bytes(
    own: KVLayout, total_kv_heads: int, sender_tp: int, block_size: int, dtype: str, tokens: int
) -> int:
    """What the areas take where a rank laid out as `own` lands a sender's KV laid out in
    `sender_tp` ranks of `block_size`-token blocks of `dtype` (worker/landing.py): one area a
    sender rank its heads are read from, each of `tokens` tokens (at least a block)."""
    held = [kv_head_range(total_kv_heads, sender_tp, r) for r in range(sender_tp)]
    heads = kv_head_range(total_kv_heads, own.tp_size, own.tp_rank)
    blocks = max(1, tokens // block_size)
    return sum(
        KVLayout(own.num_layers, blocks, block_size, len(held[r]), own.head_dim, dtype, r,
                 sender_tp).total_bytes
        for r in first_holders(heads, held)
    )  # fmt: skip


def dtype_name(dtype: object) -> str:
    """'torch.float16' / numpy dtype('float16') / 'float16' -> 'float16'."""
    return str(dtype).removeprefix("torch.")
