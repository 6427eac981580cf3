"""PrefixIndex: longest-prefix matching, bounded memory, sequence-number handling."""

from __future__ import annotations

import pytest

from core.events import AllBlocksCleared, BlockRemoved, BlockStored, BlockTiered, KVEventBatch
from core.hashing import hash_prompt_blocks, model_root_hash
from router.routing.index.prefix_index import ApplyOutcome, PrefixIndex

ROOT = model_root_hash("m", 4)


def chain(tokens: list[int]) -> list[int]:
    return hash_prompt_blocks(tokens, 4, ROOT)


def batch(worker: str, seq: int, *events) -> KVEventBatch:
    return KVEventBatch(worker, seq, list(events), model="m")


def test_longest_prefix_per_worker() -> None:
    a = chain(list(range(32)))  # 8 blocks
    b = chain(list(range(16)) + [99] * 16)  # shares 4 blocks with a
    index = PrefixIndex("m")
    index.apply(batch("w0", 0, BlockStored(None, a[:6])))
    index.apply(batch("w1", 0, BlockStored(None, b)))
    index.apply(batch("w2", 0, BlockStored(a[2], a[3:])))  # no root blocks: no prefix
    assert index.longest_prefixes(a) == {"w0": 6, "w1": 4}
    assert index.longest_prefixes(b) == {"w0": 4, "w1": 8}
    assert index.longest_prefixes([]) == {}
    # A hole in the middle of a worker's chain ends its prefix there.
    index.apply(batch("w0", 1, BlockRemoved([a[2]])))
    assert index.longest_prefixes(a) == {"w0": 2, "w1": 4}


def test_removed_blocks_leave_the_index() -> None:
    a = chain(list(range(64)))
    index = PrefixIndex("m")
    index.apply(batch("w0", 0, BlockStored(None, a)))
    index.apply(batch("w1", 0, BlockStored(None, a[:4])))
    assert index.num_hashes == 16 and index.num_entries == 20
    index.apply(batch("w0", 1, BlockRemoved(a)))
    assert index.num_hashes == 4 and index.num_entries == 4
    index.apply(batch("w1", 1, AllBlocksCleared()))
    assert index.num_hashes == 0 and index.num_entries == 0
    index.apply(batch("w1", 2, BlockRemoved([123])))  # unknown hash: ignored
    assert index.num_entries == 0


def test_gap_purges_and_marks_stale_until_snapshot() -> None:
    a = chain(list(range(32)))
    index = PrefixIndex("m")
    assert index.apply(batch("w0", 0, BlockStored(None, a))) is ApplyOutcome.APPLIED
    # seq 1 (which removed blocks) was lost; seq 2 arrives.
    assert index.apply(batch("w0", 2, BlockStored(None, a[:1]))) is ApplyOutcome.GAP
    assert index.stale_workers == {"w0"}
    assert index.longest_prefixes(a) == {"w0": 1}  # under-estimate, never over
    # The worker answers the re-sync with a self-contained batch.
    snap = batch("w0", 3, AllBlocksCleared(), BlockStored(None, a[:5]))
    assert index.apply(snap) is ApplyOutcome.APPLIED
    assert index.stale_workers == frozenset()
    assert index.longest_prefixes(a) == {"w0": 5}


def test_duplicate_restart_regression_unknown() -> None:
    a = chain(list(range(32)))
    index = PrefixIndex("m")
    index.apply(batch("w0", 0, BlockStored(None, a)))
    index.apply(batch("w0", 1, BlockRemoved(a[6:])))
    assert index.apply(batch("w0", 1, BlockRemoved(a))) is ApplyOutcome.DUPLICATE
    assert index.longest_prefixes(a) == {"w0": 6}
    # Restart: seq goes back to 0 with a fresh (different) cache.
    assert index.apply(batch("w0", 0, BlockStored(None, a[:2]))) is ApplyOutcome.RESTART
    assert index.longest_prefixes(a) == {"w0": 2} and not index.stale_workers
    index.apply(batch("w0", 1, BlockStored(a[1], a[2:3])))
    # A replayed old batch: purge, skip it, ask for a snapshot.
    assert index.apply(batch("w0", 0, BlockStored(None, a))) is ApplyOutcome.RESTART
    index.apply(batch("w0", 5, AllBlocksCleared(), BlockStored(None, a[:3])))
    assert index.apply(batch("w0", 2, BlockStored(None, a))) is ApplyOutcome.REGRESSION
    assert index.longest_prefixes(a) == {} and index.stale_workers == {"w0"}
    # A worker first heard of mid-life.
    assert index.apply(batch("w9", 7, BlockStored(None, a))) is ApplyOutcome.UNKNOWN
    assert "w9" in index.stale_workers


def test_worker_leaves_and_rejoins_with_different_cache() -> None:
    a = chain(list(range(32)))
    b = chain([7] * 32)
    index = PrefixIndex("m")
    index.apply(batch("w0", 0, BlockStored(None, a)))
    index.apply(batch("w1", 0, BlockStored(None, a[:3])))
    index.remove_worker("w0")
    assert index.longest_prefixes(a) == {"w1": 3}
    assert index.num_entries == 3
    # Rejoins (its slot may be reused) with another cache and a fresh sequence.
    index.apply(batch("w0", 0, BlockStored(None, b)))
    assert index.longest_prefixes(a) == {"w1": 3}
    assert index.longest_prefixes(b) == {"w0": 8}
    assert index.last_seq("w0") == 0


def test_many_workers_use_wide_masks() -> None:
    a = chain(list(range(16)))
    index = PrefixIndex("m")
    for w in range(300):
        index.apply(batch(f"w{w}", 0, BlockStored(None, a[: 1 + w % 4])))
    found = index.longest_prefixes(a)
    assert len(found) == 300
    assert all(found[f"w{w}"] == 1 + w % 4 for w in range(300))


def test_blocks_in_an_offload_tier_are_hits_counted_per_tier() -> None:
    a = chain(list(range(32)))  # 8 blocks
    index = PrefixIndex("m")
    index.apply(batch("w0", 0, BlockStored(None, a)))
    index.apply(batch("w1", 0, BlockStored(None, a[:4])))
    index.apply(batch("w0", 1, BlockTiered(a[5:], 1), BlockTiered(a[6:], 2)))
    index.apply(batch("w1", 1, BlockTiered(a[:1], 2)))
    found = index.longest_prefixes(a)
    assert found == {"w0": 8, "w1": 4}  # still held: a hit either way
    assert index.offloaded_blocks(a, found) == {"w0": [1, 2], "w1": [0, 1]}
    # Only blocks inside the prefix a match found count.
    assert index.offloaded_blocks(a, {"w0": 6}) == {"w0": [1, 0]}
    index.apply(batch("w0", 2, BlockStored(a[4], a[5:7])))  # copied back to the device
    assert index.offloaded_blocks(a, found) == {"w0": [0, 1], "w1": [0, 1]}
    index.apply(batch("w0", 3, BlockRemoved(a[7:])))  # fell off the last tier
    assert index.longest_prefixes(a) == {"w0": 7, "w1": 4}
    assert index.offloaded_blocks(a, {"w0": 7}) == {}
    index.apply(batch("w1", 2, AllBlocksCleared()))
    assert index.offloaded_blocks(a, found) == {} and index.num_entries == 7
    index.load_worker("w1", 5, a[:3], tiers={a[1]: 1, a[2]: 2})  # a Redis rebuild
    assert index.offloaded_blocks(a, {"w1": 3}) == {"w1": [1, 1]}
    index.remove_worker("w1")
    assert index.offloaded_blocks(a, {"w0": 7}) == {}
    with pytest.raises(ValueError, match="unknown KV tier 3"):
        index.apply(batch("w0", 4, BlockTiered(a[:1], 3)))
