"""Block pool and KV-cache manager: ref counts, prefix hits, LRU eviction, events."""

import pytest

from core.events import BlockRemoved, BlockStored
from core.hashing import hash_prompt_blocks, model_root_hash
from core.sampling import SamplingParams
from engine.kv_cache.block_pool import BlockPool
from engine.kv_cache.manager import KVCacheManager
from engine.request import Request

BS = 4
ROOT = model_root_hash("test", BS)


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams())


def run_prefill(kv: KVCacheManager, req: Request) -> None:
    hits = kv.get_computed_blocks(req)
    req.num_computed_tokens = len(hits) * BS
    assert kv.allocate_slots(req, req.num_tokens - req.num_computed_tokens, hits)
    req.num_computed_tokens = req.num_tokens
    kv.cache_computed_blocks(req)


def test_allocate_release_accounting() -> None:
    pool = BlockPool(8)
    blocks = pool.allocate(3)
    assert pool.num_used_blocks == 3 and pool.num_free_blocks == 5
    pool.check_invariants()
    pool.release(blocks)
    assert pool.num_used_blocks == 0
    pool.check_invariants()
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release(blocks[:1])
    with pytest.raises(RuntimeError, match="asked for 9"):
        pool.allocate(9)


def test_prefix_hit_reuses_blocks_and_stops_before_last_token() -> None:
    kv = KVCacheManager(16, BS, ROOT)
    a = make_request("a", list(range(10)))  # 2 full blocks + 2 tokens
    run_prefill(kv, a)
    events = kv.pool.take_events()
    assert events == [BlockStored(None, hash_prompt_blocks(list(range(10)), BS, ROOT))]
    kv.free(a)
    assert kv.pool.num_cached_blocks == 2
    b = make_request("b", list(range(8)))  # exactly the 2 cached blocks
    hits = kv.get_computed_blocks(b)
    assert len(hits) == 1, "the last token must be recomputed"
    c = make_request("c", list(range(9)))
    hits = kv.get_computed_blocks(c)
    assert [h.block_id for h in hits] == kv.block_ids("a") or len(hits) == 2
    assert kv.allocate_slots(c, 1, hits)
    assert kv.pool.num_cached_blocks == 0 and kv.pool.num_used_blocks == 3
    kv.pool.check_invariants()


def test_hash_collision_with_other_tokens_is_a_miss() -> None:
    pool = BlockPool(4)
    [block] = pool.allocate(1)
    h = hash_prompt_blocks([1, 2, 3, 4], BS, ROOT)[0]
    pool.cache_blocks([block], [h], [(1, 2, 3, 4)], None)
    assert pool.lookup(h, (1, 2, 3, 4)) is block
    assert pool.lookup(h, (9, 9, 9, 9)) is None


def test_lru_eviction_emits_removed_and_evicts_tails_first() -> None:
    kv = KVCacheManager(4, BS, ROOT)
    a = make_request("a", list(range(12)) + [99])  # 3 full blocks + 1
    run_prefill(kv, a)
    stored = kv.pool.take_events()[0]
    assert isinstance(stored, BlockStored)
    kv.free(a)
    # A fresh request needing 2 blocks takes the free one, then the LRU cached one: the
    # tail block of `a` (released first), not its first block.
    b = make_request("b", [500 + i for i in range(5)])
    assert kv.allocate_slots(b, 5)
    assert kv.pool.take_events() == [BlockRemoved([stored.block_hashes[2]])]
    c = make_request("c", list(range(9)))
    assert len(kv.get_computed_blocks(c)) == 2
    kv.pool.check_invariants()


def test_shared_blocks_are_ref_counted() -> None:
    kv = KVCacheManager(8, BS, ROOT)
    a = make_request("a", list(range(9)))
    run_prefill(kv, a)
    b = make_request("b", list(range(8)) + [42])
    run_prefill(kv, b)
    assert kv.block_ids("a")[:2] == kv.block_ids("b")[:2]
    assert kv.pool.blocks[kv.block_ids("a")[0]].ref_cnt == 2
    kv.free(a)
    assert kv.pool.blocks[kv.block_ids("b")[0]].ref_cnt == 1
    kv.free(b)
    kv.pool.check_invariants()
    assert kv.pool.num_used_blocks == 0


def test_caching_disabled_never_hits() -> None:
    kv = KVCacheManager(8, BS, ROOT, enable_caching=False)
    a = make_request("a", list(range(9)))
    run_prefill(kv, a)
    kv.free(a)
    assert kv.get_computed_blocks(make_request("b", list(range(9)))) == []
    assert kv.pool.take_events() == []
    kv.pool.check_invariants()


def test_cannot_allocate_changes_nothing() -> None:
    kv = KVCacheManager(2, BS, ROOT)
    a = make_request("a", list(range(9)))
    assert not kv.allocate_slots(a, 9)
    assert kv.block_ids("a") == [] and kv.pool.num_free_blocks == 2


def test_a_handed_over_request_s_blocks_are_evicted_first_tail_first() -> None:
    """A prefix sent to a peer that pulled it (`evict_first`): the next allocations take its
    blocks before older cached ones and before never-used ones, its tail before its head."""
    kv = KVCacheManager(8, BS, ROOT)
    old = make_request("old", list(range(100, 108)) + [1])  # 2 full blocks, cached first
    run_prefill(kv, old)
    kv.free(old)
    sent = make_request("sent", list(range(12)) + [99])  # 3 full blocks and a partial one
    run_prefill(kv, sent)
    stored = kv.pool.take_events()[1]
    assert isinstance(stored, BlockStored)
    kv.free(sent, evict_first=True)
    kv.pool.check_invariants()
    fresh = make_request("fresh", [500 + i for i in range(8)])
    assert kv.allocate_slots(fresh, 8)  # sent's partial block, then its tail
    assert kv.pool.take_events() == [BlockRemoved([stored.block_hashes[2]])]
    assert len(kv.get_computed_blocks(make_request("o", list(range(100, 108)) + [1]))) == 2
    assert len(kv.get_computed_blocks(make_request("s", list(range(12)) + [99]))) == 2


def test_blocks_a_request_of_its_own_still_holds_are_not_evicted_first() -> None:
    kv = KVCacheManager(8, BS, ROOT)
    sent, reader = make_request("s", list(range(9))), make_request("r", list(range(8)) + [7])
    run_prefill(kv, sent)
    run_prefill(kv, reader)  # hits sent's 2 full blocks: holds them too
    kv.pool.take_events()
    kv.free(sent, evict_first=True)
    kv.free(reader)  # its release, not sent's, places them: most recently used
    assert kv.allocate_slots(make_request("f", list(range(200, 224))), 24)  # the 6 others
    assert kv.pool.take_events() == []
    kv.pool.check_invariants()
