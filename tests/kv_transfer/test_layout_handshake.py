"""Layout arithmetic, region merging and the handshake's compatibility check."""

from __future__ import annotations

import random

import pytest

from core.kv_layout import KVLayout
from kv_transfer import PROTOCOL_VERSION, CompatRecord, IncompatiblePeerError, pair_regions
from kv_transfer.handshake import PeerInfo, decode_peer_info, encode
from kv_transfer.layout import pair_regions_layers

LAYOUT = KVLayout(num_layers=3, num_blocks=10, block_size=4, num_kv_heads=2, head_dim=8)


def test_block_offsets_follow_the_layout() -> None:
    assert LAYOUT.block_bytes == 2 * 4 * 2 * 8 * 2
    assert LAYOUT.block_offset(0, 0) == 0
    assert LAYOUT.block_offset(1, 3) == (10 + 3) * LAYOUT.block_bytes
    assert LAYOUT.total_bytes == 3 * 10 * LAYOUT.block_bytes


def test_regions_merge_only_where_both_sides_are_consecutive() -> None:
    bb = LAYOUT.block_bytes
    regions = pair_regions(LAYOUT, LAYOUT, 1, [2, 3, 4, 8, 9], [5, 6, 0, 1, 2])
    base = LAYOUT.block_offset(1, 0)
    assert regions == [
        (base + 2 * bb, base + 5 * bb, 2 * bb),  # 2,3 -> 5,6
        (base + 4 * bb, base + 0 * bb, bb),  # 4 -> 0: dst run breaks
        (base + 8 * bb, base + 1 * bb, 2 * bb),  # 8,9 -> 1,2
    ]


@pytest.mark.parametrize("seed", range(6))
def test_regions_of_several_layers_are_each_layers_regions(seed: int) -> None:
    rng = random.Random(seed)
    other = KVLayout(num_layers=3, num_blocks=17, block_size=4, num_kv_heads=2, head_dim=8)
    n = rng.randint(1, 10)
    if seed % 2:  # one run on both sides: the fast path
        src, dst = list(range(3, 3 + n)), list(range(7, 7 + n))
    else:
        src, dst = rng.sample(range(LAYOUT.num_blocks), n), rng.sample(range(17), n)
    layers = rng.sample(range(3), rng.randint(1, 3))
    expected = [r for layer in layers for r in pair_regions(LAYOUT, other, layer, src, dst)]
    assert pair_regions_layers(LAYOUT, other, layers, src, dst) == expected
    assert sum(nbytes for _, _, nbytes in expected) == n * len(layers) * LAYOUT.block_bytes


def test_bad_ids_and_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        LAYOUT.check_block_ids([10])
    with pytest.raises(ValueError, match="duplicate"):
        LAYOUT.check_block_ids([1, 1])
    with pytest.raises(ValueError, match="block id -1 outside"):
        LAYOUT.check_block_ids([2, -1, 3])
    LAYOUT.check_block_ids([])
    with pytest.raises(ValueError, match="layer 3"):
        LAYOUT.check_layers([3])
    with pytest.raises(ValueError, match="dtype"):
        KVLayout(1, 1, 1, 1, 1, dtype="float64")
    with pytest.raises(ValueError, match="destination"):
        pair_regions(LAYOUT, LAYOUT, 0, [1, 2], [1])


@pytest.mark.parametrize(
    ("field", "changed"),
    [
        ("block_size", KVLayout(3, 10, 16, 2, 8)),
        ("num_kv_heads", KVLayout(3, 10, 4, 4, 8)),
        ("dtype", KVLayout(3, 10, 4, 2, 8, dtype="bfloat16")),
        ("tp_rank", KVLayout(3, 10, 4, 2, 8, tp_rank=1, tp_size=2)),
    ],
)
def test_compat_mismatch_names_the_field(field: str, changed: KVLayout) -> None:
    ours = CompatRecord.from_layout(LAYOUT, "llama")
    with pytest.raises(IncompatiblePeerError, match=field) as info:
        ours.check(CompatRecord.from_layout(changed, "llama"))
    assert info.value.field == field


def test_model_identity_and_num_blocks() -> None:
    ours = CompatRecord.from_layout(LAYOUT, "llama")
    with pytest.raises(IncompatiblePeerError, match="model_id"):
        ours.check(CompatRecord.from_layout(LAYOUT, "qwen"))
    # A different number of blocks is fine: caches are sized per worker.
    ours.check(CompatRecord.from_layout(KVLayout(3, 99, 4, 2, 8), "llama"))


def test_a_peer_layout_is_its_record_and_its_block_count() -> None:
    peer = KVLayout(3, 99, 4, 2, 8, tp_rank=1, tp_size=2)
    info = PeerInfo(PROTOCOL_VERSION, "x", "local", CompatRecord.from_layout(peer, "m"), 99, b"")
    assert decode_peer_info(encode(info)).kv_layout() == peer


def test_other_protocol_versions_and_garbage_are_refused() -> None:
    info = PeerInfo(99, "x", "local", CompatRecord.from_layout(LAYOUT, "m"), 10, b"")
    with pytest.raises(IncompatiblePeerError, match="protocol_version"):
        decode_peer_info(encode(info))
    with pytest.raises(IncompatiblePeerError, match="metadata"):
        decode_peer_info(b"not msgpack at all")
