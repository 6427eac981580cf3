"""Layout arithmetic, region merging and the handshake's compatibility check."""

from __future__ import annotations

import random

import pytest

from kv_transfer import CompatRecord, IncompatiblePeerError, KVCacheSpec, pair_regions
from kv_transfer.handshake import PeerInfo, decode_peer_info, encode
from kv_transfer.layout import pair_regions_layers

SPEC = KVCacheSpec(num_layers=3, num_blocks=10, block_size=4, num_kv_heads=2, head_dim=8)


def test_block_offsets_follow_the_layout() -> None:
    assert SPEC.block_bytes == 2 * 4 * 2 * 8 * 2
    assert SPEC.block_offset(0, 0) == 0
    assert SPEC.block_offset(1, 3) == (10 + 3) * SPEC.block_bytes
    assert SPEC.total_bytes == 3 * 10 * SPEC.block_bytes


def test_regions_merge_only_where_both_sides_are_consecutive() -> None:
    bb = SPEC.block_bytes
    regions = pair_regions(SPEC, SPEC, 1, [2, 3, 4, 8, 9], [5, 6, 0, 1, 2])
    base = SPEC.block_offset(1, 0)
    assert regions == [
        (base + 2 * bb, base + 5 * bb, 2 * bb),  # 2,3 -> 5,6
        (base + 4 * bb, base + 0 * bb, bb),  # 4 -> 0: dst run breaks
        (base + 8 * bb, base + 1 * bb, 2 * bb),  # 8,9 -> 1,2
    ]


@pytest.mark.parametrize("seed", range(6))
def test_regions_of_several_layers_are_each_layers_regions(seed: int) -> None:
    rng = random.Random(seed)
    other = KVCacheSpec(num_layers=3, num_blocks=17, block_size=4, num_kv_heads=2, head_dim=8)
    n = rng.randint(1, 10)
    if seed % 2:  # one run on both sides: the fast path
        src, dst = list(range(3, 3 + n)), list(range(7, 7 + n))
    else:
        src, dst = rng.sample(range(SPEC.num_blocks), n), rng.sample(range(17), n)
    layers = rng.sample(range(3), rng.randint(1, 3))
    expected = [r for layer in layers for r in pair_regions(SPEC, other, layer, src, dst)]
    assert pair_regions_layers(SPEC, other, layers, src, dst) == expected
    assert sum(nbytes for _, _, nbytes in expected) == n * len(layers) * SPEC.block_bytes


def test_bad_ids_and_specs_are_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        SPEC.check_block_ids([10])
    with pytest.raises(ValueError, match="duplicate"):
        SPEC.check_block_ids([1, 1])
    with pytest.raises(ValueError, match="block id -1 outside"):
        SPEC.check_block_ids([2, -1, 3])
    SPEC.check_block_ids([])
    with pytest.raises(ValueError, match="layer 3"):
        SPEC.check_layers([3])
    with pytest.raises(ValueError, match="dtype"):
        KVCacheSpec(1, 1, 1, 1, 1, dtype="float64")
    with pytest.raises(ValueError, match="destination"):
        pair_regions(SPEC, SPEC, 0, [1, 2], [1])


@pytest.mark.parametrize(
    ("field", "changed"),
    [
        ("block_size", KVCacheSpec(3, 10, 16, 2, 8)),
        ("num_kv_heads", KVCacheSpec(3, 10, 4, 4, 8)),
        ("dtype", KVCacheSpec(3, 10, 4, 2, 8, dtype="bfloat16")),
        ("tp_rank", KVCacheSpec(3, 10, 4, 2, 8, tp_rank=1, tp_size=2)),
    ],
)
def test_compat_mismatch_names_the_field(field: str, changed: KVCacheSpec) -> None:
    ours = CompatRecord.from_spec(SPEC, "llama")
    with pytest.raises(IncompatiblePeerError, match=field) as info:
        ours.check(CompatRecord.from_spec(changed, "llama"))
    assert info.value.field == field


def test_model_identity_and_num_blocks() -> None:
    ours = CompatRecord.from_spec(SPEC, "llama")
    with pytest.raises(IncompatiblePeerError, match="model_id"):
        ours.check(CompatRecord.from_spec(SPEC, "qwen"))
    # A different number of blocks is fine: caches are sized per worker.
    ours.check(CompatRecord.from_spec(KVCacheSpec(3, 99, 4, 2, 8), "llama"))


def test_other_protocol_versions_and_garbage_are_refused() -> None:
    info = PeerInfo(99, "x", "local", CompatRecord.from_spec(SPEC, "m"), 10, b"")
    with pytest.raises(IncompatiblePeerError, match="protocol_version"):
        decode_peer_info(encode(info))
    with pytest.raises(IncompatiblePeerError, match="metadata"):
        decode_peer_info(b"not msgpack at all")
